#pragma once
/// \file strata/nn/patch_embedding.hpp
/// `PatchEmbedding<Patch, Units>`: a Vision Transformer's patch embedding (Dosovitskiy et al.,
/// "An image is worth 16x16 words", ICLR 2021): an image [H, W, C] cut into non-overlapping
/// Patch×Patch patches, each projected linearly to `Units` features, and laid out as tokens
/// [(H/Patch)·(W/Patch), Units] in row-major patch order (the patch at row i, column j is token
/// i·(W/Patch) + j).
///
/// It is the strided convolution Keras' ViT uses (keras_hub's ViTPatchingAndEmbedding: a
/// `Conv2D(hidden_dim, patch_size, strides=patch_size, padding="valid")` named
/// `patch_embedding`, then a reshape to tokens), computed by strata's `Conv2D<Units, Patch,
/// Linear, Patch>` itself: the convolution's NHWC output [H/P, W/P, Units] already is the token
/// matrix in memory, so the reshape is only a change of shape. Variables are the convolution's,
/// `patch_embedding/kernel` [Patch, Patch, C, Units] (Glorot uniform with Conv2D's fans) and
/// `patch_embedding/bias` [Units] (zeros).
///
/// Why a layer and not `Conv2D` followed by a reshape: strata has no Reshape layer, and a valid
/// strided convolution silently drops the rows and columns a patch size that does not divide
/// the image leaves over; this layer refuses that at compile time, naming the image and the
/// patch size (PatchSizeError<Layer, Input, Patch>).

#include <cstdint>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/nn/conv2d.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {
template <std::int64_t Patch, std::int64_t Units, bool UseBias, class In, class T, class P>
class PatchEmbeddingImpl;
}

/// Image [H, W, C] to tokens [(H/Patch)·(W/Patch), Units]: one linear projection per
/// non-overlapping Patch×Patch patch. Patch must divide H and W.
///
/// \code
/// using Stem = Sequential<Input<28, 28, 1>, PatchEmbedding<4, 64>>;   // 49 tokens of 64
/// static_assert(std::is_same_v<Stem::output_shape, strata::StaticShape<49, 64>>);
/// \endcode
template <std::int64_t Patch, std::int64_t Units, bool UseBias = true>
struct PatchEmbedding {
    static_assert(Patch >= 1, "strata::nn::PatchEmbedding<Patch, Units>: Patch must be >= 1");
    static_assert(Units >= 1, "strata::nn::PatchEmbedding<Patch, Units>: Units must be >= 1");
    static constexpr const char* name = "PatchEmbedding";
    static constexpr const char* keras_name = "patch_embedding";
    static constexpr std::int64_t patch_size = Patch, units = Units;
    template <class In, class T, class P>
    using bind = detail::PatchEmbeddingImpl<Patch, Units, UseBias, In, T, P>;
};

/// Fails with a message naming the layer, the image and the patch size that does not divide it
/// (the template arguments of PatchSizeError<Layer, Input, Patch> in the instantiation the
/// compiler prints).
template <class Layer, class Input, std::int64_t Patch, bool Ok>
struct PatchSizeError {
    static_assert(Ok, "strata::nn::PatchEmbedding<Patch, Units>: Patch must divide the image's height and width (the "
                      "patches tile the image; a remainder would be dropped); the layer, the image [H, W, C] and the "
                      "patch size are the template arguments of PatchSizeError<Layer, Input, Patch>");
    static constexpr bool value = Ok;
};

namespace detail {

template <std::int64_t Patch, std::int64_t Units, bool UseBias, class In, class T, class P>
class PatchEmbeddingImpl {
    using Spec = PatchEmbedding<Patch, Units, UseBias>;
    static constexpr bool rank_ok = In::rank == 3;
    static_assert(LayerShapeError<Spec, AnyShapeOfRank<3>, In, rank_ok>::value,
                  "strata::nn::PatchEmbedding: the input must be an image, rank 3 per example (height, width, channels)");
    static constexpr std::int64_t H = rank_ok ? In::dims[0] : Patch, W = rank_ok ? In::dims[1] : Patch;
    static constexpr std::int64_t C = rank_ok ? In::dims[rank_ok ? 2 : 0] : 1;
    static constexpr bool divides = H % Patch == 0 && W % Patch == 0;
    static_assert(PatchSizeError<Spec, In, Patch, !rank_ok || divides>::value,
                  "strata::nn::PatchEmbedding: the patch size does not divide the image");

public:
    using input_shape = In;
    // (At least one patch a side, so that a malformed input still gives the next layers tokens:
    // one mistake, one error.)
    static constexpr std::int64_t grid_h = H / Patch > 0 ? H / Patch : 1, grid_w = W / Patch > 0 ? W / Patch : 1;
    /// Tokens per image: the patches, row-major.
    static constexpr std::int64_t tokens = grid_h * grid_w;
    using output_shape = std::conditional_t<rank_ok, StaticShape<tokens, Units>, In>;

private:
    // The convolution over the image; on a malformed input, over the whole patches (not run).
    using Conv = Conv2DImpl<Conv2D<Units, Patch, Linear, Patch, Padding::Valid, UseBias>, StaticShape<grid_h * Patch, grid_w * Patch, C>, T, P>;

public:
    static constexpr std::int64_t num_params = Conv::num_params;

    static std::vector<ParamInfo> param_info() { return Conv::param_info(); }
    void init(T* params, std::uint64_t seed, std::uint64_t stream) const { conv_.init(params, seed, stream); }
    void reserve(std::int64_t n, bool training) { conv_.reserve(n, training); }

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        conv_.forward(params, x, image(y), mode);
    }
    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& y, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode& mode) {
        conv_.backward(params, grads, x, image(y), image(dy), dx, mode);
    }

private:
    // Tokens [n, tokens, Units] seen as the convolution's output [n, H/P, W/P, Units].
    static TensorView<T, P> image(const TensorView<T, P>& t) {
        return TensorView<T, P>(t.data(), Shape{t.dim(0), grid_h, grid_w, Units});
    }
    Conv conv_;
};

}  // namespace detail

}  // namespace strata::nn
