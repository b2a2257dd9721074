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
/// \endcode
///
/// `x` is [n, input_shape...], `y` is [n, output_shape...]. `backward` receives the layer's own
/// forward input and output, the gradient of the loss w.r.t. `y` (which it may overwrite), and
/// writes the gradient w.r.t. its parameters into `grads` (overwriting) and w.r.t. `x` into `dx`
/// (an empty view for the first layer: skip that work). Parameters are passed in rather than
/// owned so that replicas can share one copy (CentralStorage) or hold their own (Mirrored).

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

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
};

/// One parameter tensor of a layer: its Keras name ("kernel", "bias"), shape and offset into
/// the layer's block of the flat parameter buffer.
struct ParamInfo {
    std::string name;
    Shape shape;
    std::int64_t offset = 0;
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

}  // namespace strata::nn
