#pragma once
/// \file strata/core/precision.hpp
/// The precision policies: what type a model's variables are kept in and what type its layers
/// compute in (Keras' "variable dtype" and "compute dtype"), chosen at compile time beside the
/// strategy, the place and the sync mode, as Model's third argument:
///
/// \code
/// strata::Model<Net, strata::distribute::Mirrored<>, strata::precision::MixedBFloat16> model(strategy);
/// \endcode
///
/// | policy          | variables, slots, statistics, checkpoints | layer inputs, weights and outputs | GEMMs on a GPU            |
/// |-----------------|--------------------------------------------|-----------------------------------|---------------------------|
/// | `Float32`       | float                                      | float                             | FP32                      |
/// | `TF32`          | float                                      | float                             | TF32 tensor cores (hosts: as Float32) |
/// | `MixedBFloat16` | float                                      | bfloat16 values                   | FP32 (16-bit path: issue 44) |
/// | `MixedFloat16`  | float, with a dynamic loss scale           | float16 values                    | FP32 (16-bit path: issue 44) |
///
/// `float` and `double` as Model's third argument stay what they were: every type that one.
/// `Any` is chosen at run time (Model::set_precision), for tools that keep one instantiation
/// for every policy (strata_train's --precision), as sync::Any is for sync modes.
///
/// How a mixed policy computes (docs/precision.md): every layer reads its input, and its
/// weights, as values of the compute type, computes in float32 inside (the accumulation of its
/// products, as the fused GPU kernels do), and hands on its output rounded to the compute type
/// (round to nearest, ties to even); backward does the same with the gradients that flow between
/// layers. Three things stay float32, as Keras keeps them: the normalization layers' variables
/// and arithmetic, the last layer's output (so the loss is computed in float32), and the
/// variables' gradients (the GEMMs that make them accumulate and write float32). Storage is
/// float either way: on a host without 16-bit arithmetic the values are exactly what 16-bit
/// storage would hold, but take float's room.

#include <cstdint>
#include <string>
#include <type_traits>

namespace strata {

namespace precision {

/// The type a policy's layers compute in.
enum class Compute : std::uint8_t { Float32, TF32, BFloat16, Float16 };

/// The policy tags (Model's third argument).
struct Float32 {
    static constexpr Compute compute = Compute::Float32;
    static constexpr const char* name = "float32";
};
struct TF32 {
    static constexpr Compute compute = Compute::TF32;
    static constexpr const char* name = "tf32";
};
struct MixedBFloat16 {
    static constexpr Compute compute = Compute::BFloat16;
    static constexpr const char* name = "mixed_bfloat16";
};
struct MixedFloat16 {
    static constexpr Compute compute = Compute::Float16;
    static constexpr const char* name = "mixed_float16";
};
/// Chosen at run time (Model::set_precision): one instantiation for every policy.
struct Any {
    static constexpr const char* name = "any";
};

/// Keras' policy names: "float32", "tf32", "mixed_bfloat16", "mixed_float16".
inline const char* name_of(Compute c) {
    switch (c) {
        case Compute::Float32: return "float32";
        case Compute::TF32: return "tf32";
        case Compute::BFloat16: return "mixed_bfloat16";
        case Compute::Float16: return "mixed_float16";
    }
    return "?";
}
/// The policy named `name` (name_of's names); false for any other.
inline bool parse(const std::string& name, Compute& out) {
    for (Compute c : {Compute::Float32, Compute::TF32, Compute::BFloat16, Compute::Float16})
        if (name == name_of(c)) {
            out = c;
            return true;
        }
    return false;
}
/// Whether layers' values are rounded to a 16-bit type under `c`.
constexpr bool is_mixed(Compute c) { return c == Compute::BFloat16 || c == Compute::Float16; }
/// Whether `c` needs a loss scale (float16's range: gradients below 2^-24 flush to zero).
constexpr bool scales_loss(Compute c) { return c == Compute::Float16; }

template <class Prec>
inline constexpr bool is_policy_v = std::is_same_v<Prec, Float32> || std::is_same_v<Prec, TF32> ||
                                    std::is_same_v<Prec, MixedBFloat16> || std::is_same_v<Prec, MixedFloat16> ||
                                    std::is_same_v<Prec, Any>;

/// The variables' element type under Model's third argument: float for every policy, the type
/// itself for float and double.
template <class Prec>
struct variable_type {
    using type = Prec;
};
template <class Prec>
    requires is_policy_v<Prec>
struct variable_type<Prec> {
    using type = float;
};
template <class Prec>
using variable_t = typename variable_type<Prec>::type;

/// The compute type a compile-time policy fixes (float and double: themselves, Float32).
template <class Prec>
constexpr Compute compute_of() {
    if constexpr (requires { Prec::compute; }) return Prec::compute;
    else return Compute::Float32;
}

}  // namespace precision

}  // namespace strata
