#pragma once
/// \file strata/nn/dropout.hpp
/// `Dropout<Numerator, Denominator = 100>`: inverted dropout with rate Numerator/Denominator
/// (`Dropout<25>` drops 25 %, `Dropout<1, 3>` a third), as Keras does it: in training each value
/// is kept with probability 1 − rate and scaled by 1 / (1 − rate), so inference is the identity.
/// Srivastava et al., "Dropout: a simple way to prevent neural networks from overfitting",
/// JMLR 2014.
///
/// The mask is a pure function of (Mode::seed, Mode::step, the layer's stream, element index),
/// drawn from Philox (strata/core/random.hpp): the same on every place and for any thread
/// count, and different at every step and in every Dropout layer of a model. The backward pass
/// recomputes the mask instead of storing it: it costs one Philox block per four values, which
/// is cheaper than writing and reading back a mask as large as the activation, and it keeps the
/// layer free of per-batch state.

#include <cstdint>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/core/random.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {

// Value g of the global batch (g counts from the first example of the whole global batch, so
// a replica's share draws exactly what one device would for the same examples) uses lane g % 4
// of the Philox block g / 4. The counter's low word carries a domain bit (so masks never reuse
// the counters that parameter initialisation uses), the layer's stream and the block index;
// the high word is the step.
// The Philox counter's fixed part for a layer's masks: bit 63 marks dropout counters (init's never
// set it), the stream takes bits 40..62, and DropoutElements adds the block index (bits 0..39).
constexpr std::uint64_t dropout_counter_base(std::uint64_t stream) {
    return (std::uint64_t(1) << 63) | ((stream & ((std::uint64_t(1) << 23) - 1)) << 40);
}

template <class T>
struct DropoutElements {
    const T* in;
    T* out;
    std::uint64_t offset;
    std::uint64_t seed, step, base;
    std::uint32_t threshold;  // keep a value when its 24 random bits are >= threshold
    T scale;
    // Values i of a part of a larger tensor (a shard's heads): blocks of `block` consecutive
    // values, `stride` apart in the whole; block 0: the values are consecutive (i itself).
    std::int64_t block = 0, stride = 0;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::uint64_t g = offset + std::uint64_t(block > 0 ? i / block * stride + i % block : i);
        const auto r = random::Philox4x32::generate(seed, base | (g >> 2), step);
        out[i] = (r.v[g & 3] >> 8) >= threshold ? in[i] * scale : T(0);
    }
};

template <std::int64_t Numerator, std::int64_t Denominator, class In, class T, class P>
class DropoutImpl;

}  // namespace detail

/// Inverted dropout with rate Numerator/Denominator (a compile-time fraction: `Dropout<25>` is
/// Keras's `Dropout(0.25)`, `Dropout<1, 2>` is `Dropout(0.5)`).
///
/// Requires: 0 <= Numerator < Denominator. Any input shape.
/// Ensures: same output shape as input; no parameters. With `Mode::training`, value i is kept
/// (and multiplied by Denominator / (Denominator − Numerator)) when 24 bits of
/// Philox(Mode::seed; counter from Mode::step, the layer's stream, i) are at least
/// ceil(rate · 2^24), else zeroed; the same (seed, step) gives the same mask. Without
/// training, the output is the input.
///
/// The layer's stream separates the masks of several Dropout layers in one model. A Network
/// hands each layer its stream in `init` (layer index × 16), so a model whose parameters were
/// initialised with `Network::init` gets distinct masks per layer; `set_stream` sets it
/// directly (for a Network whose parameters were loaded instead).
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<784>, Dense<128, ReLU>, Dropout<20>, Dense<10, Softmax>>;
/// Mode train{.training = true, .step = step, .seed = 42};
/// \endcode
template <std::int64_t Numerator, std::int64_t Denominator>
struct Dropout {
    static_assert(Denominator >= 1 && Numerator >= 0 && Numerator < Denominator,
                  "strata::nn::Dropout<Numerator, Denominator>: the rate Numerator/Denominator must be in [0, 1), "
                  "e.g. Dropout<25> for 0.25 or Dropout<1, 3> for a third");
    static constexpr const char* name = "Dropout";
    static constexpr const char* keras_name = "dropout";
    /// The fraction of values dropped in training.
    static constexpr double rate = double(Numerator) / double(Denominator);
    template <class In, class T, class P>
    using bind = detail::DropoutImpl<Numerator, Denominator, In, T, P>;
};

namespace detail {

/// The bound dropout (see strata/nn/layer.hpp).
template <std::int64_t Numerator, std::int64_t Denominator, class In, class T, class P>
class DropoutImpl {
public:
    using input_shape = In;
    /// Carries the token mask (TokenMask): its output has the input's tokens, each from its own.
    static constexpr TokenMask token_mask = TokenMask::Passes;
    using output_shape = In;
    static constexpr std::int64_t num_params = 0;
    /// ceil(rate · 2^24): a value is kept when its 24 random bits reach it.
    static constexpr std::uint32_t threshold =
        std::uint32_t(((std::uint64_t(Numerator) << 24) + std::uint64_t(Denominator) - 1) / std::uint64_t(Denominator));

    static std::vector<ParamInfo> param_info() { return {}; }
    /// Records the layer's stream (the Network passes layer index × 16); there are no parameters.
    void init(T*, std::uint64_t, std::uint64_t stream) const { stream_ = stream; }
    /// Sets the stream that separates this layer's masks from those of other Dropout layers.
    void set_stream(std::uint64_t stream) { stream_ = stream; }
    std::uint64_t stream() const { return stream_; }

    void forward(const T*, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        apply(x, y, mode);
    }

    /// The gradient is the same mask and scale applied to dy.
    void backward(const T*, T*, const TensorView<T, P>&, const TensorView<T, P>&, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const Mode& mode) {
        if (!dx.empty()) apply(dy, dx, mode);
    }

private:
    void apply(const TensorView<T, P>& in, const TensorView<T, P>& out, const Mode& mode) const {
        if (!mode.training || Numerator == 0) {
            if (in.data() != out.data()) copy(in, out.reshape(in.shape()));
            return;
        }
        const std::uint64_t base = dropout_counter_base(stream_);
        const auto offset = std::uint64_t(mode.first_example) * std::uint64_t(In::size);
        if (in.size() > 0)
            place::for_each_n<P>(in.size(),
                               DropoutElements<T>{in.data(), out.data(), offset, mode.seed, mode.step, base, threshold,
                                                  T(double(Denominator) / double(Denominator - Numerator))});
    }

    // Set through the const `init` of the layer contract: it is configuration, not state.
    mutable std::uint64_t stream_ = 0;
};

}  // namespace detail

}  // namespace strata::nn
