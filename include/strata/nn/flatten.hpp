#pragma once
/// \file strata/nn/flatten.hpp
/// `Flatten`: [n, d1, d2, ...] -> [n, d1*d2*...], in NHWC order (as Keras with
/// channels_last), so a following Dense kernel means the same thing as in Keras.

#include <cstdint>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {
template <class In, class T, class P>
class FlattenImpl;
}

/// Flattens each example to rank 1. No parameters; the data are not moved (a view).
struct Flatten {
    static constexpr const char* name = "Flatten";
    static constexpr const char* keras_name = "flatten";
    template <class In, class T, class P>
    using bind = detail::FlattenImpl<In, T, P>;
};

namespace detail {
template <class In, class T, class P>
class FlattenImpl {
public:
    using input_shape = In;
    using output_shape = StaticShape<In::size>;
    static constexpr std::int64_t num_params = 0;
    /// The output is the input seen with another shape: Sequential aliases the buffers.
    static constexpr bool aliases_input = true;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) const {}
    void forward(const T*, const TensorView<T, P>&, const TensorView<T, P>&, const Mode&) {}
    void backward(const T*, T*, const TensorView<T, P>&, const TensorView<T, P>&, const TensorView<T, P>&,
                  const TensorView<T, P>&, const Mode&) {}
};
}  // namespace detail

}  // namespace strata::nn
