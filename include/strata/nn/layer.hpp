#pragma once
/// \file strata/nn/layer.hpp
/// The layer contract. A *layer spec* is what a user writes in a Sequential (`Dense<64, ReLU>`);
/// binding it to an input shape, an element type and a place gives the *bound layer* that
/// computes:
///
/// \code
/// struct MySpec {
///     static constexpr const char* name = "MyLayer";            // type name in summary()
///     static constexpr const char* keras_name = "my_layer";     // variable names: my_layer/kernel
///     template <class In, class T, class P> using bind = MyImpl<In, T, P>;
/// };
/// // MyImpl<In, T, P> provides:
/// //   using input_shape = In;  using output_shape = StaticShape<...>;     (per example)
/// //   static constexpr std::int64_t num_params;                          (all its parameters)
/// //   static std::vector<ParamInfo> param_info();                        (name, shape, offset)
/// //   void init(T* params, std::uint64_t seed, std::uint64_t stream) const;
/// //   void forward(const T* params, const TensorView<T,P>& x, const TensorView<T,P>& y, const Mode&);
/// //   void backward(const T* params, T* grads, const TensorView<T,P>& x, const TensorView<T,P>& y,
/// //                 const TensorView<T,P>& dy, const TensorView<T,P>& dx, const Mode&);
/// //   static constexpr bool integer_input = true;    (optional: the input holds integer ids,
/// //                                                   which a mixed policy must not round)
/// \endcode
///
/// `x` is [n, input_shape...], `y` is [n, output_shape...]. `backward` receives the layer's own
/// forward input and output, the gradient of the loss w.r.t. `y` (which it may overwrite), and
/// writes the gradient w.r.t. its parameters into `grads` (overwriting) and w.r.t. `x` into `dx`
/// (an empty view for the first layer: skip that work). Parameters are passed in rather than
/// owned so that replicas can share one copy (CentralStorage) or hold their own (Mirrored).

#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/core/error.hpp"
#include "strata/core/function_ref.hpp"
#include "strata/core/precision.hpp"
#include "strata/core/profile.hpp"
#include "strata/core/shape.hpp"
#include "strata/tensor/tensor_all.hpp"

namespace strata::nn {

/// What a forward/backward pass is for.
struct Mode {
    /// Training (Dropout drops, statistics update) or inference.
    bool training = false;
    /// The last layer leaves its Softmax to the loss (fused softmax + cross-entropy).
    bool skip_activation = false;
    /// A counter that changes every step (Dropout draws its mask from (seed, step)).
    std::uint64_t step = 0;
    std::uint64_t seed = 0;
    /// Index of this batch's first example in the global batch (a replica's share starts
    /// there): random layers key their draws on global positions, so N replicas draw what one
    /// device would.
    std::int64_t first_example = 0;
    /// No backward follows this forward (evaluate, predict): a layer may skip storing what only
    /// backward reads (a Conv2D whose pooling runs on its output chunk by chunk does not store
    /// that output).
    bool no_backward = false;
    /// Examples in the whole global batch this pass's batch is a share of (0: this batch is the
    /// whole of it). Batch normalization weighs its statistics by its share of them.
    std::int64_t global_examples = 0;
    /// Sums values over every replica that computes this step in lockstep (in this process and
    /// across processes; in the hybrid, over the replicas' same micro-batch), in place; empty
    /// where the replica is alone (one device, one pipeline replica, evaluation). Synchronized batch normalization combines its statistics with
    /// it. Every replica calls it the same number of times in the same order (one whose share
    /// is empty too: Network::join_empty).
    FunctionRef<void(std::span<double>)> replica_sum = nullptr;
    /// The statistics replica_sum combines cover part of the global batch, not all of it (a
    /// pipeline's micro-batch over its replicas): batch normalization then weighs them by its
    /// rows' share of `global_examples`, as the unsynchronized layer does, rather than by the
    /// summed count (which under Mirrored is the whole global batch).
    bool partial_statistics = false;
    /// The precision policy's compute type (strata/core/precision.hpp): under a mixed policy
    /// Network rounds what passes between layers, and the weights the layers read, to it.
    precision::Compute compute = precision::Compute::Float32;
    /// The token mask (Keras' mask_zero: Embedding<V, D, {.mask_zero = true}>): [n, mask_tokens]
    /// values of T on the layers' place, 1 for a token that counts and 0 for padding (id 0);
    /// null without one. Network makes it from the model's input and hands it to every layer;
    /// attention gives masked keys weight 0, GlobalAveragePooling1D averages the tokens that
    /// count (see TokenMask below).
    const void* token_mask = nullptr;
    std::int64_t mask_tokens = 0;
};

/// One variable of a layer: its Keras name ("kernel", "bias", "moving_mean"), shape and offset
/// into the layer's block of the flat parameter buffer. Variables that are not trained
/// (`trainable == false`: batch normalization's moving statistics) live in the same buffer,
/// where Keras' `get_weights()` puts them (after the layer's trainable ones); backward writes the
/// batch's statistic into their gradient slot (weighted by the replica's share of the global
/// batch, so the gradient all-reduce gives the global batch's), and the optimizer moves them by
/// `w = momentum·w + (1 − momentum)·statistic` instead of a gradient step
/// (optim::MovingAverageRange).
struct ParamInfo {
    std::string name;
    Shape shape;
    std::int64_t offset = 0;
    bool trainable = true;
    /// For a variable that is not trained: its moving average's momentum.
    double momentum = 0;
    /// Read in float32 under a mixed precision policy (the normalization layers' variables:
    /// their arithmetic is float32, as Keras keeps it); other variables are read rounded to the
    /// compute type. Variables that are not trained are never rounded.
    bool float32 = false;
};

/// The per-example input shape of a Sequential: `Input<28, 28, 1>`.
template <std::int64_t... D>
struct Input {
    static_assert(sizeof...(D) >= 1, "strata::nn::Input<D...>: give at least one extent");
    static_assert(((D > 0) && ...), "strata::nn::Input<D...>: every extent must be positive");
    using shape = StaticShape<D...>;
};

/// Fails with a message naming the layer and both shapes (they appear in the instantiation the
/// compiler prints: LayerShapeError<Layer, Expected, Found>).
template <class Layer, class Expected, class Found, bool Ok>
struct LayerShapeError {
    static_assert(Ok, "strata::nn: this layer cannot take its input's shape; the layer, the shape it expects and the "
                      "shape it was given are the template arguments of LayerShapeError<Layer, Expected, Found> "
                      "(in the instantiation the compiler prints with this error)");
    static constexpr bool value = Ok;
};

/// Describes an expected shape in LayerShapeError messages: any rank-R shape.
template <int R>
struct AnyShapeOfRank {};
/// Describes an expected shape in LayerShapeError messages: a spatial size of at least H×W.
template <std::int64_t H, std::int64_t W>
struct AtLeastSpatial {};

namespace detail {
template <class T, class U>
constexpr bool always_true_v = true;
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// The Layer concept: what Sequential requires of a layer spec and of the layer it binds to.
// ---------------------------------------------------------------------------------------------

/// The parts of the layer contract, one concept each, so that a failure can name the part.
namespace layer_requirements {

/// `static constexpr const char* name`: the type name summary() prints ("Dense").
template <class Spec>
concept has_name = requires {
    { Spec::name } -> std::convertible_to<const char*>;
};
/// `static constexpr const char* keras_name`: the variable prefix ("dense" in dense/kernel).
template <class Spec>
concept has_keras_name = requires {
    { Spec::keras_name } -> std::convertible_to<const char*>;
};
/// `template <class In, class T, class P> using bind = ...`: the layer that computes for
/// per-example input shape In, element type T and place P.
template <class Spec, class In, class T, class P>
concept has_bind = requires { typename Spec::template bind<In, T, P>; };

/// `using input_shape = In;` and `using output_shape = StaticShape<...>;` (per example).
template <class L>
concept has_shapes = requires {
    typename L::input_shape;
    typename L::output_shape;
    { L::output_shape::size } -> std::convertible_to<std::int64_t>;
    L::output_shape::dims;
};
/// `static constexpr std::int64_t num_params` (0 for a layer without parameters).
template <class L>
concept has_num_params = requires {
    { L::num_params } -> std::convertible_to<std::int64_t>;
};
/// `static std::vector<ParamInfo> param_info()`: name, shape and offset of each parameter.
template <class L>
concept has_param_info = requires {
    { L::param_info() } -> std::convertible_to<std::vector<ParamInfo>>;
};
/// `void init(T* params, std::uint64_t seed, std::uint64_t stream)`.
template <class L, class T>
concept has_init = requires(L& layer, T* params, std::uint64_t seed) { layer.init(params, seed, seed); };
/// `void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode&)`.
template <class L, class T, class P>
concept has_forward = requires(L& layer, const T* params, const TensorView<T, P>& v, const Mode& mode) {
    layer.forward(params, v, v, mode);
};
/// `void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& y,
/// const TensorView<T, P>& dy, const TensorView<T, P>& dx, const Mode&)`.
template <class L, class T, class P>
concept has_backward = requires(L& layer, const T* params, T* grads, const TensorView<T, P>& v, const Mode& mode) {
    layer.backward(params, grads, v, v, v, v, mode);
};

}  // namespace layer_requirements

/// A layer spec: what a user writes in a Sequential (`Dense<64, ReLU>`, or a struct of their
/// own). Requires `name`, `keras_name` and a `bind` template (see the top of this file).
template <class Spec>
concept LayerSpec = layer_requirements::has_name<Spec> && layer_requirements::has_keras_name<Spec>;

/// A bound layer: what a spec's `bind<In, T, P>` gives, the object that computes. Requires the
/// shapes, `num_params`, `param_info()`, `init`, `forward` and `backward` of the contract at the
/// top of this file, and a default constructor (a Network holds its layers by value).
///   static_assert(strata::nn::Layer<MyLayer::bind<StaticShape<4>, float, place::Host>, float, place::Host>);
template <class L, class T, class P>
concept Layer = layer_requirements::has_shapes<L> && layer_requirements::has_num_params<L> &&
                layer_requirements::has_param_info<L> && layer_requirements::has_init<L, T> &&
                layer_requirements::has_forward<L, T, P> && layer_requirements::has_backward<L, T, P> &&
                std::default_initializable<L>;

namespace detail {

/// Stands in for a layer that failed its checks, so that the compiler reports the failed
/// requirement (below) and not a cascade of errors from the code that uses the layer.
template <class In, class T, class P>
struct InvalidLayer {
    using input_shape = In;
    using output_shape = In;
    static constexpr std::int64_t num_params = 0;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) const {}
    void forward(const T*, const TensorView<T, P>&, const TensorView<T, P>&, const Mode&) {}
    void backward(const T*, T*, const TensorView<T, P>&, const TensorView<T, P>&, const TensorView<T, P>&,
                  const TensorView<T, P>&, const Mode&) {}
};

/// Whether a place runs a layer's elementwise passes one element per thread (a GPU) rather than
/// in blocks of rows (the host): each place gets the shape of loop it is fast with.
template <class P>
constexpr bool elementwise_place = std::is_same_v<P, place::Cuda>;

/// Runs f(i) for i in [0, count) on P. On a GPU place, with `reach` (the size of the largest
/// array f addresses, or 0 when count is that) within 32 bits, i is a std::int32_t, so that a
/// functor whose call operator is a template over the index type does its index arithmetic in
/// 32 bits; otherwise (and on the host) a std::int64_t.
template <class P, class Functor>
void for_each_index(std::int64_t count, Functor f, std::int64_t reach = 0) {
    if (count <= 0) return;
    if constexpr (elementwise_place<P>) {
        if ((count > reach ? count : reach) <= std::int64_t(INT32_MAX)) {
            place::for_each_n<P>(std::int32_t(count), f);
            return;
        }
    }
    place::for_each_n<P>(count, f);
}

template <class Spec, class In, class T, class P, bool = layer_requirements::has_bind<Spec, In, T, P>>
struct bind_or_invalid {
    using type = InvalidLayer<In, T, P>;
};
template <class Spec, class In, class T, class P>
struct bind_or_invalid<Spec, In, T, P, true> {
    using type = typename Spec::template bind<In, T, P>;
};

}  // namespace detail

/// Binds the layer spec `Spec` to input shape `In`, element type `T` and place `P`, checking the
/// Layer contract one requirement at a time: each missing member is a static_assert whose
/// sentence names it, with `Spec` the first template argument of `CheckedLayer<...>` in the
/// instantiation the compiler prints. Sequential binds every layer through it.
template <class Spec, class In, class T, class P>
struct CheckedLayer {
    static_assert(layer_requirements::has_name<Spec>,
                  "strata::nn::Layer: the layer spec (first argument of CheckedLayer) has no name: add "
                  "`static constexpr const char* name = \"MyLayer\";` (its type name in summary())");
    static_assert(layer_requirements::has_keras_name<Spec>,
                  "strata::nn::Layer: the layer spec (first argument of CheckedLayer) has no keras_name: add "
                  "`static constexpr const char* keras_name = \"my_layer\";` (the prefix of its variable names)");
    static_assert(layer_requirements::has_bind<Spec, In, T, P>,
                  "strata::nn::Layer: the layer spec (first argument of CheckedLayer) has no bind: add "
                  "`template <class In, class T, class P> using bind = MyLayerImpl<In, T, P>;` (the layer that "
                  "computes for input shape In, element type T and place P)");
    using bound = typename detail::bind_or_invalid<Spec, In, T, P>::type;
    static_assert(layer_requirements::has_shapes<bound>,
                  "strata::nn::Layer: the bound layer has no input_shape or output_shape: add `using input_shape = In;` "
                  "and `using output_shape = StaticShape<...>;` (its per-example output shape)");
    static_assert(layer_requirements::has_num_params<bound>,
                  "strata::nn::Layer: the bound layer has no num_params: add `static constexpr std::int64_t "
                  "num_params = ...;` (0 for a layer without parameters)");
    static_assert(layer_requirements::has_param_info<bound>,
                  "strata::nn::Layer: the bound layer has no param_info(): add `static std::vector<ParamInfo> "
                  "param_info();` (name, shape and offset of each parameter; {} without parameters)");
    static_assert(layer_requirements::has_init<bound, T>,
                  "strata::nn::Layer: the bound layer has no init(T* params, std::uint64_t seed, std::uint64_t stream) "
                  "(it fills the layer's parameters)");
    static_assert(layer_requirements::has_forward<bound, T, P>,
                  "strata::nn::Layer: the bound layer has no forward(const T* params, const TensorView<T, P>& x, "
                  "const TensorView<T, P>& y, const Mode& mode) (it writes y from x)");
    static_assert(layer_requirements::has_backward<bound, T, P>,
                  "strata::nn::Layer: the bound layer has no backward(const T* params, T* grads, const TensorView<T, P>& x, "
                  "const TensorView<T, P>& y, const TensorView<T, P>& dy, const TensorView<T, P>& dx, const Mode& mode) "
                  "(it writes the parameter gradients into grads and the input gradient into dx)");
    static_assert(std::default_initializable<bound>,
                  "strata::nn::Layer: the bound layer has no default constructor (a Network holds its layers by value)");
    static constexpr bool ok = LayerSpec<Spec> && layer_requirements::has_bind<Spec, In, T, P> && Layer<bound, T, P>;
    /// The bound layer, or a stand-in when a check failed (the static_assert above says why).
    using type = std::conditional_t<ok, bound, detail::InvalidLayer<In, T, P>>;
};

/// Whether bound layer L takes integer ids as its input (`static constexpr bool integer_input =
/// true;`, as Embedding's bound layer has): under a mixed precision policy Network leaves the
/// model's input as it is when its first layer does (bfloat16 keeps integers exactly only up to
/// 256, float16 up to 2048). Optional; a layer without the member takes real values.
template <class L>
constexpr bool takes_integer_input() {
    if constexpr (requires { L::integer_input; }) return bool(L::integer_input);
    else return false;
}

/// The summary() name of a spec ("?" when it has none: CheckedLayer reports that).
template <class Spec>
constexpr const char* spec_name() {
    if constexpr (layer_requirements::has_name<Spec>) return Spec::name;
    else return "?";
}
/// The Keras variable prefix of a spec ("layer" when it has none: CheckedLayer reports that).
template <class Spec>
constexpr const char* spec_keras_name() {
    if constexpr (layer_requirements::has_keras_name<Spec>) return Spec::keras_name;
    else return "layer";
}

/// Introduces neighbouring bound layers (a Network's layers I and I + 1 that it runs, a
/// Residual branch's K and K + 1): `a.link_next(b)` where layer A has one. Optional; a layer
/// that must know what consumes its output declares it (Megatron's column-parallel layer, whose
/// output a row-parallel layer split the same way reads as it is: distribute/tensor_parallel.hpp).
template <class A, class B>
void link_neighbours(A& a, B& b) {
    if constexpr (requires { a.link_next(b); }) a.link_next(b);
}

/// What a bound layer does with the token mask (Mode::token_mask), as Keras' supports_masking
/// and compute_mask say it: `Passes` (its output has the input's tokens, each computed from its
/// own token or, for attention, from the tokens that count: LayerNormalization, TokenDense,
/// Dropout, ActivationLayer, PositionEmbedding, MultiHeadAttention, Residual blocks of those),
/// `Consumes` (its output has no token axis, and padding does not reach it:
/// GlobalAveragePooling1D, FirstToken), `Prepends` (its output is one token that counts followed
/// by its input's: ClassToken; the layers after it get the mask with a 1 in front, and at most
/// one such layer carries the mask), or `Unsupported` (the default: a layer that does not declare
/// `static constexpr TokenMask token_mask`). A Network whose first layer makes a mask requires
/// every layer up to a consumer, or up to a per-token output, to carry it (a compile-time error
/// naming the layer otherwise: strata/nn/embedding.hpp).
enum class TokenMask { Unsupported, Passes, Consumes, Prepends };

namespace detail {
template <class L>
constexpr TokenMask token_mask_use() {
    if constexpr (requires { L::token_mask; }) return TokenMask(L::token_mask);
    else return TokenMask::Unsupported;
}
/// Whether bound layer L makes the token mask from its input (Embedding with mask_zero).
template <class L>
constexpr bool makes_token_mask() {
    if constexpr (requires { L::mask_zero; }) return bool(L::mask_zero);
    else return false;
}
}  // namespace detail

/// The token mask's values for this pass as T on the layer's place, after checking that it
/// covers `tokens` tokens per example (null without a mask). `layer` names the caller.
template <class T>
const T* token_mask_of(const Mode& mode, std::int64_t tokens, const char* layer) {
    if (!mode.token_mask) return nullptr;
    STRATA_CHECK(mode.mask_tokens == tokens, ValueError, layer, ": the token mask covers ", mode.mask_tokens,
                 " tokens per example and this layer's input has ", tokens,
                 " (a layer before it changed the number of tokens: the mask cannot follow)");
    return static_cast<const T*>(mode.token_mask);
}

}  // namespace strata::nn
