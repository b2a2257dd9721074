#pragma once
/// \file strata/data/augment.hpp
/// Seeded image augmentation for the input pipeline (`Dataset::augment`, strata/data/dataset.hpp):
/// a random crop after zero padding and a random horizontal flip, the two of the classic CIFAR
/// and Fashion-MNIST recipe (`RandomCrop(padding=P)` then `RandomHorizontalFlip()` in
/// torchvision, `RandomCrop` after `ZeroPadding2D` and `RandomFlip("horizontal")` in Keras).
///
/// Images are channels last: an example of shape {H, W, C} holds H rows of W pixels of C floats.
///
/// Exactness across replicas. What happens to an example is a pure function of the seed, the
/// pass (the epoch given to `Dataset::iterate`) and the example's position in that pass (0, 1,
/// 2, ... in the order the step sees them, that is after any shuffle before it): never of the
/// batch it lands in, of how many replicas share that batch, or of which thread runs the
/// pipeline. The Dataset augments a global batch before a strategy splits it
/// (distribute/distributed_dataset.hpp), so N replicas train on exactly the images one device
/// would. The draws come from strata's counter-based Philox generator (core/random.hpp):
///
///   key(seed, pass)  = the first two words of Philox4x32(key = seed, counter = (pass, "augment"))
///   example i's draws: random::Generator(key(seed, pass), /*stream=*/i):
///                      flip = a.flip && (next_u32() >> 31) == 1, then dy = below(2P + 1),
///                      then dx = below(2P + 1)
///
/// so the flips are the same whatever the padding, and the crop offsets whether flips are on or
/// off.
///
/// \code
///   namespace sd = strata::data;
///   auto train = sd::from_arrays(std::move(x), {28, 28, 1}, std::move(y))
///                    .shuffle(60000, /*seed=*/42)
///                    .augment({.pad = 4, .flip = true, .seed = 1})   // training data only
///                    .batch(128);
/// \endcode

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/random.hpp"

namespace strata::data {

/// What Dataset::augment does to each image (channels last, {H, W, C}).
struct Augment {
    /// Zero padding on each side: the image is padded to (H + 2 pad) x (W + 2 pad), then cropped
    /// back to H x W at a random offset (dy, dx), each uniform in [0, 2 pad]; (pad, pad) is the
    /// original image. 0: no crop. Requires 0 <= pad < min(H, W).
    int pad = 0;
    /// Mirror the (cropped) image left-right with probability 1/2.
    bool flip = false;
    /// Seeds the draws (independent of any shuffle's seed).
    std::uint64_t seed = 0;
};

/// The draws for one example: where its crop starts in the padded image, and whether it is
/// mirrored.
struct AugmentDraw {
    int dy = 0;         ///< first row of the crop in the padded image, in [0, 2 pad]
    int dx = 0;         ///< first column of the crop in the padded image, in [0, 2 pad]
    bool flip = false;  ///< mirror the crop left-right
    friend bool operator==(const AugmentDraw&, const AugmentDraw&) = default;
};

/// The 64-bit key of pass `pass` for `seed`: a Philox block of (seed; pass, "augment").
inline std::uint64_t augment_pass_key(std::uint64_t seed, std::uint64_t pass) noexcept {
    constexpr std::uint64_t tag = 0x6175676D656E74ull;  // "augment"
    const auto r = random::Philox4x32::generate(seed, pass, tag);
    return (std::uint64_t(r.v[0]) << 32) | r.v[1];
}

/// The draws of the example at `position` in a pass whose key is `pass_key`
/// (augment_pass_key): see the file comment. Requires a.pad >= 0.
inline AugmentDraw augment_draw_keyed(const Augment& a, std::uint64_t pass_key, std::uint64_t position) noexcept {
    random::Generator g(pass_key, position);
    AugmentDraw d;
    d.flip = (g.next_u32() >> 31) != 0 && a.flip;  // drawn even when off: the offsets stay the same
    const auto n = static_cast<std::uint64_t>(a.pad) * 2 + 1;
    d.dy = static_cast<int>(g.below(n));
    d.dx = static_cast<int>(g.below(n));
    return d;
}

/// The draws Dataset::augment(a) makes for the example at `position` (0-based, in the order the
/// step sees the examples) of pass `pass` (the epoch given to iterate). Requires a.pad >= 0.
inline AugmentDraw augment_draw(const Augment& a, std::uint64_t pass, std::uint64_t position) noexcept {
    return augment_draw_keyed(a, augment_pass_key(a.seed, pass), position);
}

namespace detail {
// augment_image without the checks: `in` and `out` hold h * w * c floats each and do not overlap.
inline void augment_image_unchecked(const float* in, float* out, std::size_t h, std::size_t w, std::size_t c,
                                    std::size_t pad, const AugmentDraw& d) noexcept {
    const auto H = static_cast<std::ptrdiff_t>(h), W = static_cast<std::ptrdiff_t>(w),
               P = static_cast<std::ptrdiff_t>(pad);
    const std::ptrdiff_t dy = d.dy, dx = d.dx;
    const std::size_t row = w * c;
    // Crop column j (before any flip) reads image column j + dx - P: inside the image for j in
    // [j0, j1), padding outside (pad < W, so the range is never empty).
    const std::ptrdiff_t j0 = std::max<std::ptrdiff_t>(0, P - dx), j1 = std::min<std::ptrdiff_t>(W, W + P - dx);
    for (std::ptrdiff_t r = 0; r < H; ++r) {
        float* o = out + static_cast<std::size_t>(r) * row;
        const std::ptrdiff_t sr = r + dy - P;
        if (sr < 0 || sr >= H) {
            std::fill(o, o + row, 0.0f);
            continue;
        }
        const float* irow = in + static_cast<std::size_t>(sr) * row;
        if (!d.flip) {
            std::fill(o, o + static_cast<std::size_t>(j0) * c, 0.0f);
            std::memcpy(o + static_cast<std::size_t>(j0) * c, irow + static_cast<std::size_t>(j0 + dx - P) * c,
                        static_cast<std::size_t>(j1 - j0) * c * sizeof(float));
            std::fill(o + static_cast<std::size_t>(j1) * c, o + row, 0.0f);
        } else {
            // Output column j is crop column W - 1 - j.
            for (std::ptrdiff_t j = 0; j < W; ++j) {
                const std::ptrdiff_t cj = W - 1 - j;
                float* op = o + static_cast<std::size_t>(j) * c;
                if (cj >= j0 && cj < j1) std::memcpy(op, irow + static_cast<std::size_t>(cj + dx - P) * c, c * sizeof(float));
                else std::fill(op, op + c, 0.0f);
            }
        }
    }
}
}  // namespace detail

/// Writes to `out` the image `in` (height x width x channels floats, row-major, channels last)
/// zero-padded by `pad` pixels on each side, cropped back to height x width from row d.dy and
/// column d.dx of the padded image, then mirrored left-right when d.flip:
///
///   out(r, j) = padded(r + dy, j' + dx),  j' = width - 1 - j when flipped, j otherwise,
///   padded(i, k) = in(i - pad, k - pad) inside the image, 0 in the padding.
///
/// What Dataset::augment does to each example with that example's augment_draw.
/// Requires: in.size() == out.size() == height * width * channels (ShapeError otherwise);
/// 0 <= pad < min(height, width) and d.dy, d.dx in [0, 2 pad] (ValueError otherwise); `in` and
/// `out` do not overlap.
inline void augment_image(std::span<const float> in, std::span<float> out, std::size_t height, std::size_t width,
                          std::size_t channels, int pad, const AugmentDraw& d) {
    const std::size_t n = height * width * channels;
    STRATA_CHECK(n > 0 && in.size() == n && out.size() == n, ShapeError, "augment_image: expected ", height, "x",
                 width, "x", channels, " = ", n, " floats in and out, found ", in.size(), " in and ", out.size(),
                 " out");
    STRATA_CHECK(pad >= 0 && static_cast<std::size_t>(pad) < std::min(height, width), ValueError,
                 "augment_image: expected 0 <= pad < min(height, width) = ", std::min(height, width), ", found pad ",
                 pad);
    STRATA_CHECK(d.dy >= 0 && d.dy <= 2 * pad && d.dx >= 0 && d.dx <= 2 * pad, ValueError,
                 "augment_image: expected crop offsets in [0, ", 2 * pad, "] (2 pad), found dy ", d.dy, ", dx ", d.dx);
    detail::augment_image_unchecked(in.data(), out.data(), height, width, channels, static_cast<std::size_t>(pad), d);
}

}  // namespace strata::data
