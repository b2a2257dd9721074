// The precision policies (issue 44) on the host: what a mixed policy rounds and what it keeps
// float32, against a float64 reference that rounds at the same points (and a negative control
// that does not); float16's underflow without a loss scale, and the loss scale's rules through
// Model (skip, halve, grow, floor, one decision for every replica); N replicas against one
// device under each policy; checkpoints across policies.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "test_images.hpp"
#include "test_util.hpp"

#include <strata/distribute/parameter_server.hpp>
#include <strata/distribute/pipeline.hpp>
#include <strata/strata.hpp>

using namespace strata::nn;
namespace dist = strata::distribute;
namespace prec = strata::precision;
using strata_test::images;

namespace {

using strata::bfloat16;
using strata::float16;

double rnd(double x, prec::Compute c) {
    if (c == prec::Compute::BFloat16) return strata::round_to<bfloat16>(float(x));
    if (c == prec::Compute::Float16) return strata::round_to<float16>(float(x));
    return x;
}

// Two Dense layers: 8 → 16 (ReLU) → 4.
using Mlp = Sequential<Input<8>, Dense<16, ReLU>, Dense<4>>;
constexpr std::int64_t B = 5;

struct MlpRef {
    std::vector<double> out;      // [B, 4]
    std::vector<double> g;        // the gradient of every variable, flat
};

// Forward and backward of Mlp in float64, rounding (to `c`) where a mixed policy rounds: the
// input, the weights (kernels and biases), the hidden output, the gradient handed from the
// second layer to the first. `round_points` false: the float64 network without any rounding.
MlpRef mlp_reference(const std::vector<float>& w, const std::vector<float>& x, const std::vector<float>& dy, prec::Compute c,
                     bool round_points) {
    auto r = [&](double v) { return round_points ? rnd(v, c) : v; };
    const std::int64_t k1 = 0, b1 = 8 * 16, k2 = b1 + 16, b2 = k2 + 16 * 4;
    MlpRef ref;
    ref.out.assign(B * 4, 0);
    ref.g.assign(w.size(), 0);
    std::vector<double> h(B * 16), dh(B * 16);
    for (std::int64_t n = 0; n < B; ++n) {
        for (int j = 0; j < 16; ++j) {
            double z = r(w[std::size_t(b1 + j)]);
            for (int i = 0; i < 8; ++i) z += r(x[std::size_t(n * 8 + i)]) * r(w[std::size_t(k1 + i * 16 + j)]);
            h[std::size_t(n * 16 + j)] = r(std::max(z, 0.0));
        }
        for (int j = 0; j < 4; ++j) {
            double z = r(w[std::size_t(b2 + j)]);
            for (int i = 0; i < 16; ++i) z += h[std::size_t(n * 16 + i)] * r(w[std::size_t(k2 + i * 4 + j)]);
            ref.out[std::size_t(n * 4 + j)] = z;  // the last layer's output: float32, not rounded
        }
    }
    for (std::int64_t n = 0; n < B; ++n) {
        for (int j = 0; j < 4; ++j) {
            const double d = dy[std::size_t(n * 4 + j)];
            ref.g[std::size_t(b2 + j)] += d;
            for (int i = 0; i < 16; ++i) ref.g[std::size_t(k2 + i * 4 + j)] += h[std::size_t(n * 16 + i)] * d;
        }
        for (int i = 0; i < 16; ++i) {
            double s = 0;
            for (int j = 0; j < 4; ++j) s += dy[std::size_t(n * 4 + j)] * r(w[std::size_t(k2 + i * 4 + j)]);
            dh[std::size_t(n * 16 + i)] = h[std::size_t(n * 16 + i)] > 0 ? r(s) : 0.0;
        }
        for (int j = 0; j < 16; ++j) {
            const double d = dh[std::size_t(n * 16 + j)];
            ref.g[std::size_t(b1 + j)] += d;
            for (int i = 0; i < 8; ++i) ref.g[std::size_t(k1 + i * 16 + j)] += r(x[std::size_t(n * 8 + i)]) * d;
        }
    }
    return ref;
}

double max_rel(const std::vector<double>& ref, const std::vector<float>& got) {
    double scale = 0, m = 0;
    for (double v : ref) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < ref.size(); ++i) m = std::max(m, std::abs(ref[i] - double(got[i])));
    return m / std::max(scale, 1e-30);
}

// The network's output and gradients for one forward and backward under `c`.
std::pair<std::vector<float>, std::vector<float>> run_mlp(const std::vector<float>& w, const std::vector<float>& x,
                                                          const std::vector<float>& dy, prec::Compute c) {
    Network<Mlp, float, strata::place::Host> net;
    std::vector<float> xs = x, grads(w.size(), 0.f);
    const Mode mode{.training = true, .compute = c};
    auto out = net.forward(w.data(), strata::TensorView<float>(xs.data(), strata::Shape{B, 8}), mode);
    std::vector<float> o(out.data(), out.data() + out.size());
    auto og = net.output_grad();
    std::copy(dy.begin(), dy.end(), og.data());
    net.backward(w.data(), grads.data(), mode);
    return {o, grads};
}

std::vector<float> as_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

}  // namespace

TEST_CASE("mixed policies: the layers read rounded inputs and weights, hand on rounded outputs; the model's output, "
          "variables and their gradients stay float32") {
    const auto w = as_float(strata_test::lcg(std::size_t(Mlp::num_params), 3, -0.7, 0.7));
    const auto x = as_float(strata_test::lcg(std::size_t(B * 8), 4, -2, 2));
    const auto dy = as_float(strata_test::lcg(std::size_t(B * 4), 5, -1, 1));
    const std::vector<float> w_before = w, x_before = x;
    for (prec::Compute c : {prec::Compute::BFloat16, prec::Compute::Float16}) {
        CAPTURE(prec::name_of(c));
        const auto [out, grads] = run_mlp(w, x, dy, c);
        const MlpRef rounded = mlp_reference(w, x, dy, c, true);
        const MlpRef plain = mlp_reference(w, x, dy, c, false);
        // float32 accumulation of products of 16-bit values: float rounding only.
        CHECK(max_rel(rounded.out, out) < 2e-6);
        CHECK(max_rel(rounded.g, grads) < 2e-6);
        // The negative control: without the rounding the reference is off by the 16-bit type's
        // precision (2^-9 bfloat16, 2^-12 float16), far above float's.
        const double unit = c == prec::Compute::BFloat16 ? 0x1p-9 : 0x1p-12;
        CHECK(max_rel(plain.out, out) > unit / 16);
        CHECK(max_rel(plain.g, grads) > unit / 16);
        // The output is not rounded (some element is not a 16-bit value).
        bool some_unrounded = false;
        for (float v : out) some_unrounded |= double(v) != rnd(v, c);
        CHECK(some_unrounded);
        // Nothing the caller gave was written.
        CHECK(w == w_before);
        CHECK(x == x_before);
    }
    // Float32 and TF32 (on the host) round nothing: the plain reference.
    for (prec::Compute c : {prec::Compute::Float32, prec::Compute::TF32}) {
        const auto [out, grads] = run_mlp(w, x, dy, c);
        const MlpRef plain = mlp_reference(w, x, dy, c, false);
        CHECK(max_rel(plain.out, out) < 2e-6);
        CHECK(max_rel(plain.g, grads) < 2e-6);
    }
}

TEST_CASE("float16 without a loss scale: small gradients flush to zero between layers; scaled, they survive") {
    const auto w = as_float(strata_test::lcg(std::size_t(Mlp::num_params), 3, -0.7, 0.7));
    const auto x = as_float(strata_test::lcg(std::size_t(B * 8), 4, -2, 2));
    auto dy = as_float(strata_test::lcg(std::size_t(B * 4), 5, -1, 1));
    for (float& v : dy) v *= 1e-8f;  // below float16's smallest subnormal (2^-24 ≈ 6e-8) once summed
    const auto [o32, g32] = run_mlp(w, x, dy, prec::Compute::Float32);
    const auto [o16, g16] = run_mlp(w, x, dy, prec::Compute::Float16);
    const std::int64_t first_kernel = 8 * 16;
    int nonzero32 = 0, nonzero16 = 0;
    for (std::int64_t i = 0; i < first_kernel; ++i) {
        nonzero32 += g32[std::size_t(i)] != 0;
        nonzero16 += g16[std::size_t(i)] != 0;
    }
    CHECK(nonzero32 > 64);
    CHECK(nonzero16 < nonzero32 / 4);  // most of the first layer's gradient is lost
    // Scaled by 2^15 (the loss scale's start), then divided back: float16's precision of float32's.
    auto scaled = dy;
    for (float& v : scaled) v *= 32768.f;
    const auto [os, gs] = run_mlp(w, x, scaled, prec::Compute::Float16);
    std::vector<double> back(gs.size());
    for (std::size_t i = 0; i < gs.size(); ++i) back[i] = double(gs[i]) / 32768.0;
    std::vector<double> ref(g32.begin(), g32.end());
    CHECK(max_rel(ref, as_float(back)) < 2e-3);
}

namespace {

using ImgNet = Sequential<Input<6, 6, 2>, Conv2D<4, 3, ReLU>, Flatten, Dense<8, ReLU>, Dense<3, Softmax>>;

template <class Prec, class Strategy>
std::unique_ptr<strata::Model<ImgNet, Strategy, Prec>> trained(Strategy& s, strata::optim::Optimizer opt, int epochs,
                                                              std::size_t batch = 12, std::size_t n = 48) {
    auto m = std::make_unique<strata::Model<ImgNet, Strategy, Prec>>(s, 7);
    m->compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    m->fit(images(n, 5).batch(batch), {.epochs = epochs, .verbose = 0});
    return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
    return m;
}

}  // namespace

TEST_CASE("MixedFloat16: the loss scale starts at 2^15, grows after growth_steps clean steps, and divides out") {
    dist::OneDevice<> one;
    strata::optim::SGD sgd{.learning_rate = 0.05};
    sgd.loss_scale.initial_scale = 8;
    sgd.loss_scale.growth_steps = 2;
    auto m = trained<prec::MixedFloat16>(one, sgd, 1);  // 4 steps: 8 → 16 → 32
    CHECK(m->loss_scale().scale == 32);
    CHECK(m->loss_scale().skipped_steps == 0);
    CHECK(m->loss_scale().good_steps == 0);
    // Defaults: Keras' start.
    dist::OneDevice<> one2;
    strata::Model<ImgNet, dist::OneDevice<>, prec::MixedFloat16> fresh(one2, 7);
    fresh.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    CHECK(fresh.loss_scale().scale == 32768);
    // The scale divides out: the same steps under float32 and under float16 with scale 1 or
    // 2^15 end near each other (float16's rounding, not a factor of the scale).
    dist::OneDevice<> a, b;
    const auto w32 = trained<prec::Float32>(a, strata::optim::SGD{.learning_rate = 0.05}, 2)->get_weights();
    const auto w16 = trained<prec::MixedFloat16>(b, strata::optim::SGD{.learning_rate = 0.05}, 2)->get_weights();
    CHECK(max_abs_diff(w32, w16) < 5e-3);
    CHECK(max_abs_diff(w32, w16) > 0);
}

TEST_CASE("MixedFloat16: a step whose gradient overflows is skipped (nothing moves, the scale halves), on every replica") {
    strata::optim::SGD sgd{.learning_rate = 0.05, .momentum = 0.9};
    sgd.loss_scale.initial_scale = 0x1p40;  // the loss's gradient times 2^40 overflows float16 (65504)
    dist::OneDevice<> one;
    strata::Model<ImgNet, dist::OneDevice<>, prec::MixedFloat16> m(one, 7);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, sgd);
    const auto w0 = m.get_weights();
    m.fit(images(12, 5).batch(12), {.epochs = 1, .verbose = 0});  // one step
    CHECK(m.get_weights() == w0);
    CHECK(m.loss_scale().skipped_steps == 1);
    CHECK(m.loss_scale().scale == 0x1p39);
    CHECK(m.loss_scale().last_skipped);
    CHECK(m.optimizer_iterations() == 0);
    // Until the scale fits: every step skipped halves it, then steps apply.
    m.fit(images(12 * 40, 5).batch(12), {.epochs = 1, .verbose = 0});
    const auto st = m.loss_scale();
    CHECK(st.skipped_steps > 15);
    CHECK(st.skipped_steps < 41);
    CHECK(m.optimizer_iterations() == 41 - st.skipped_steps);
    CHECK(st.scale == 0x1p40 / std::ldexp(1.0, int(st.skipped_steps)));
    CHECK(m.get_weights() != w0);
    // Two replicas (Mirrored) and CentralStorage take the same decisions on the same global
    // batches, and end where one device does (float32 rounding of the sums).
    const auto reference = m.get_weights();
    {
        dist::Mirrored<> two(2);
        strata::Model<ImgNet, dist::Mirrored<>, prec::MixedFloat16> r(two, 7);
        r.compile(strata::loss::SparseCategoricalCrossentropy{}, sgd);
        r.fit(images(12, 5).batch(12), {.epochs = 1, .verbose = 0});
        r.fit(images(12 * 40, 5).batch(12), {.epochs = 1, .verbose = 0});
        CHECK(r.loss_scale().skipped_steps == st.skipped_steps);
        CHECK(r.loss_scale().scale == st.scale);
        CHECK(r.optimizer_iterations() == m.optimizer_iterations());
        CHECK(max_abs_diff(r.get_weights(), reference) < 1e-3);
    }
    {
        dist::CentralStorage<> two(2);
        strata::Model<ImgNet, dist::CentralStorage<>, prec::MixedFloat16> r(two, 7);
        r.compile(strata::loss::SparseCategoricalCrossentropy{}, sgd);
        r.fit(images(12, 5).batch(12), {.epochs = 1, .verbose = 0});
        r.fit(images(12 * 40, 5).batch(12), {.epochs = 1, .verbose = 0});
        CHECK(r.loss_scale().skipped_steps == st.skipped_steps);
        CHECK(r.loss_scale().scale == st.scale);
        CHECK(max_abs_diff(r.get_weights(), reference) < 1e-3);
    }
    // A pipeline's stages each update their own layers, and take one decision: the stages'
    // sums of squares are summed before any applies. At<3> puts the last Dense alone on stage
    // 1: its kernel's gradient is computed in float32 and stays finite under a scale at which
    // the float16 input gradient it hands to stage 0 overflows, so stages deciding alone would
    // disagree (stage 1 would apply the first step, stage 0 skip it).
    // One micro-batch a step, and the hybrid's two copies: one device's decisions.
    using S = dist::Pipeline<strata::place::Host, dist::GPipe, dist::split::At<3>>;
    for (int replicas : {1, 2}) {
        CAPTURE(replicas);
        S pipeline({.micro_batches = 1, .replicas = replicas});
        strata::Model<ImgNet, S, prec::MixedFloat16> r(pipeline, 7);
        r.compile(strata::loss::SparseCategoricalCrossentropy{}, sgd);
        r.fit(images(12, 5).batch(12), {.epochs = 1, .verbose = 0});
        CHECK(r.get_weights() == w0);
        r.fit(images(12 * 40, 5).batch(12), {.epochs = 1, .verbose = 0});
        CHECK(r.loss_scale().skipped_steps == st.skipped_steps);
        CHECK(r.loss_scale().scale == st.scale);
        CHECK(r.optimizer_iterations() == m.optimizer_iterations());
        CHECK(max_abs_diff(r.get_weights(), reference) < 1e-3);
    }
    // ParameterServer, synchronous, 2 workers of 6 examples (the global batch of 12) and 6
    // servers, one variable each (round-robin): each server's part of the update's sum of
    // squares is summed before any applies, so all skip the steps one device skips. Servers
    // deciding alone would disagree: the last Dense's kernel and bias, each alone on a server,
    // get gradients computed in float32 that stay finite where the float16 ones before overflow.
    {
        namespace ss = strata::sync;
        using PS = dist::ParameterServer<strata::place::Host, ss::Synchronous>;
        PS ps(2, 6, {.clock = dist::Clock::Virtual});
        strata::Model<ImgNet, PS, prec::MixedFloat16> r(ps, 7);
        r.compile(strata::loss::SparseCategoricalCrossentropy{}, sgd);
        r.fit(images(12, 5).batch(6), {.epochs = 1, .verbose = 0});
        CHECK(r.get_weights() == w0);
        CHECK(r.loss_scale().skipped_steps == 1);
        r.fit(images(12 * 40, 5).batch(6), {.epochs = 1, .verbose = 0});
        CHECK(r.loss_scale().skipped_steps == st.skipped_steps);
        CHECK(r.loss_scale().scale == st.scale);
        CHECK(r.optimizer_iterations() == m.optimizer_iterations());
        CHECK(max_abs_diff(r.get_weights(), reference) < 1e-3);
    }
}

TEST_CASE("MixedFloat16 under asynchronous ParameterServer: each update skipped alone; a gradient computed under an older "
          "scale is brought to the current one") {
    namespace ss = strata::sync;
    strata::optim::SGD sgd{.learning_rate = 0.05, .momentum = 0.9};
    sgd.loss_scale.initial_scale = 0x1p40;
    // One worker is sequential SGD: one device's decisions, step by step.
    dist::OneDevice<> one;
    strata::Model<ImgNet, dist::OneDevice<>, prec::MixedFloat16> m(one, 7);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, sgd);
    m.fit(images(12 * 40, 5).batch(12), {.epochs = 1, .verbose = 0});
    using Async = dist::ParameterServer<strata::place::Host, ss::Asynchronous<>>;
    {
        Async ps(1, 2, {.clock = dist::Clock::Virtual});
        strata::Model<ImgNet, Async, prec::MixedFloat16> r(ps, 7);
        r.compile(strata::loss::SparseCategoricalCrossentropy{}, sgd);
        r.fit(images(12 * 40, 5).batch(12), {.epochs = 1, .verbose = 0});
        CHECK(r.loss_scale().skipped_steps == m.loss_scale().skipped_steps);
        CHECK(r.loss_scale().scale == m.loss_scale().scale);
        CHECK(max_abs_diff(r.get_weights(), m.get_weights()) < 1e-6);
    }
    // Bulk synchronous (Asynchronous<0>): each clock's 3 workers compute on the same version and
    // scale, and their pushes close one update each. With growth after every applied step the
    // scale doubles between those pushes, so the second and third gradients were computed under
    // a smaller scale than the one in force: brought to it, they train exactly as a run whose
    // scale never grows (powers of 2 scale float16 values exactly while nothing overflows or
    // underflows). Without the rescaling they would be 2 and 4 times too small.
    {
        using Bulk = dist::ParameterServer<strata::place::Host, ss::Asynchronous<0>>;
        auto run = [&](std::int64_t growth) {
            strata::optim::SGD s{.learning_rate = 0.05};
            s.loss_scale.initial_scale = 0x1p6;
            s.loss_scale.growth_steps = growth;
            Bulk ps(3, 2, {.clock = dist::Clock::Virtual});
            strata::Model<ImgNet, Bulk, prec::MixedFloat16> r(ps, 7);
            r.compile(strata::loss::SparseCategoricalCrossentropy{}, s);
            r.fit(images(12 * 6, 5).batch(12), {.epochs = 1, .verbose = 0});
            return std::pair{r.get_weights(), r.loss_scale()};
        };
        const auto [grown, grown_scale] = run(1);
        const auto [fixed, fixed_scale] = run(1000000);
        CHECK(grown_scale.skipped_steps == 0);
        CHECK(grown_scale.scale == 0x1p12);  // 6 updates, each doubling it
        CHECK(fixed_scale.scale == 0x1p6);
        CHECK(max_abs_diff(grown, fixed) < 1e-6);
    }
    // Three workers: every update is one worker's gradient, and most were computed before the
    // updates in between halved the scale. Brought to the current scale they are applied
    // (or skipped) as gradients of that scale: the weights stay finite, and training goes on
    // once the scale fits. Without the rescaling a gradient computed under 2^40 would be divided
    // by a scale up to 2^20 times smaller and move the weights by 2^20 times its size.
    {
        Async ps(3, 2, {.clock = dist::Clock::Virtual});
        strata::Model<ImgNet, Async, prec::MixedFloat16> r(ps, 7);
        r.compile(strata::loss::SparseCategoricalCrossentropy{}, sgd);
        const auto h = r.fit(images(12 * 60, 5).batch(12), {.epochs = 1, .verbose = 0});
        const auto st = r.loss_scale();
        CHECK(st.skipped_steps > 10);
        CHECK(st.scale < 0x1p30);
        CHECK(r.optimizer_iterations() > 5);
        const auto w = r.get_weights();
        CHECK(std::all_of(w.begin(), w.end(), [](float x) { return std::isfinite(x) && std::fabs(x) < 10; }));
        CHECK(max_abs_diff(w, m.get_weights()) < 1.0);
        CHECK(std::isfinite(h.history.at("loss").back()));
    }
}

TEST_CASE("MixedFloat16: a scale that would fall below its floor stops with an error naming the step and the layer") {
    strata::optim::Adam adam{};
    adam.loss_scale.initial_scale = 0x1p40;
    adam.loss_scale.floor = 0x1p38;  // two halvings allowed, the third refused
    dist::OneDevice<> one;
    strata::Model<ImgNet, dist::OneDevice<>, prec::MixedFloat16> m(one, 7);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    std::string what;
    try {
        m.fit(images(48, 5).batch(12), {.epochs = 1, .verbose = 0});
    } catch (const strata::NumericError& e) {
        what = e.what();
    }
    CAPTURE(what);
    CHECK(what.find("at step 0 (after 3 skipped steps)") != std::string::npos);
    CHECK(what.find("floor 274877906944") != std::string::npos);
    // The first trained variable in the buffer whose gradient is not finite: the convolution's.
    CHECK(what.find("conv2d/") != std::string::npos);
    CHECK(m.loss_scale().skipped_steps == 3);
}

TEST_CASE("MixedBFloat16: two replicas and CentralStorage end where one device does; bfloat16 training tracks float32") {
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9};
    dist::OneDevice<> one;
    const auto ref = trained<prec::MixedBFloat16>(one, opt, 3)->get_weights();
    dist::Mirrored<> two(2);
    const auto mir = trained<prec::MixedBFloat16>(two, opt, 3)->get_weights();
    dist::CentralStorage<> cs(2);
    const auto cen = trained<prec::MixedBFloat16>(cs, opt, 3)->get_weights();
    dist::OneDevice<> f32;
    const auto w32 = trained<prec::Float32>(f32, opt, 3)->get_weights();
    const double d_mir = max_abs_diff(ref, mir), d_cen = max_abs_diff(ref, cen), d_32 = max_abs_diff(ref, w32);
    MESSAGE("bfloat16: Mirrored x2 ", d_mir, ", CentralStorage x2 ", d_cen, " from one device; float32 ", d_32);
    CHECK(d_mir < 1e-3);
    CHECK(d_cen < 1e-3);
    // The policy changes the result (a bfloat16 run is not a float32 run) by more than the
    // replicas do.
    CHECK(d_32 > 4 * std::max(d_mir, d_cen));
}

TEST_CASE("precision::Any: chosen at run time, refused where the compile-time policy would not compile") {
    dist::OneDevice<> one;
    strata::Model<ImgNet, dist::OneDevice<>, prec::Any> m(one, 7);
    CHECK(m.dtype_policy() == prec::Compute::Float32);
    m.set_precision(prec::Compute::BFloat16);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    CHECK_THROWS_AS(m.set_precision(prec::Compute::Float16), strata::ValueError);  // after compile
    m.fit(images(24, 5).batch(12), {.epochs = 1, .verbose = 0});
    // The same as the compile-time policy, bit for bit.
    dist::OneDevice<> two;
    const auto fixed = trained<prec::MixedBFloat16>(two, strata::optim::SGD{.learning_rate = 0.1}, 1, 12, 24)->get_weights();
    CHECK(m.get_weights() == fixed);
}

TEST_CASE("MixedFloat16: the loss scale is in History and in checkpoints; a resumed run goes on bit for bit") {
    strata::optim::Adam adam{.learning_rate = 0.01};
    adam.loss_scale.initial_scale = 0x1p22;  // a few skipped steps first
    adam.loss_scale.growth_steps = 3;
    const auto data = images(96, 5).batch(12);  // 8 steps an epoch
    dist::OneDevice<> a;
    strata::Model<ImgNet, dist::OneDevice<>, prec::MixedFloat16> straight(a, 7);
    straight.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    const auto history = straight.fit(data, {.epochs = 4, .verbose = 0});
    REQUIRE(history.history.count("loss_scale") == 1);
    REQUIRE(history.history.count("skipped_steps") == 1);
    const auto& scales = history.history.at("loss_scale");
    CHECK(scales.size() == 4);
    CHECK(scales.back() == straight.loss_scale().scale);
    CHECK(history.history.at("skipped_steps").back() == double(straight.loss_scale().skipped_steps));
    CHECK(straight.loss_scale().skipped_steps > 0);

    strata_test::TempDir dir;
    const auto path = (dir.path / "resume.safetensors").string();
    dist::OneDevice<> b;
    strata::Model<ImgNet, dist::OneDevice<>, prec::MixedFloat16> first(b, 7);
    first.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    first.fit(data, {.epochs = 2, .verbose = 0});
    first.save(path);
    dist::OneDevice<> c;
    strata::Model<ImgNet, dist::OneDevice<>, prec::MixedFloat16> resumed(c, 99);
    resumed.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    resumed.load(path);
    CHECK(resumed.loss_scale().scale == first.loss_scale().scale);
    CHECK(resumed.loss_scale().good_steps == first.loss_scale().good_steps);
    CHECK(resumed.loss_scale().skipped_steps == first.loss_scale().skipped_steps);
    resumed.fit(data, {.epochs = 4, .verbose = 0, .initial_epoch = 2});
    CHECK(resumed.get_weights() == straight.get_weights());
    CHECK(resumed.loss_scale().scale == straight.loss_scale().scale);
    // The negative control: resumed with the scale reset to its start, the run differs.
    dist::OneDevice<> d;
    strata::Model<ImgNet, dist::OneDevice<>, prec::MixedFloat16> reset(d, 99);
    reset.compile(strata::loss::SparseCategoricalCrossentropy{}, adam);
    reset.load(path);
    reset.gradient_path().set_loss_scale_state({.scale = 0x1p22});
    reset.fit(data, {.epochs = 4, .verbose = 0, .initial_epoch = 2});
    CHECK(reset.get_weights() != straight.get_weights());

    // A checkpoint written under one policy loads under any other (the variables are float32).
    dist::OneDevice<> e;
    strata::Model<ImgNet, dist::OneDevice<>, prec::Float32> f32(e, 1);
    f32.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    f32.load(path);
    CHECK(f32.get_weights() == first.get_weights());
    dist::OneDevice<> g;
    strata::Model<ImgNet, dist::OneDevice<>, prec::MixedBFloat16> bf(g, 1);
    bf.load(path);
    CHECK(bf.get_weights() == first.get_weights());
}

TEST_CASE("MixedBFloat16 in a pipeline: the stages hand rounded activations and gradients across; one micro-batch is one device") {
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9};
    dist::OneDevice<> one;
    const auto ref = trained<prec::MixedBFloat16>(one, opt, 2)->get_weights();
    using S = dist::Pipeline<strata::place::Host, dist::GPipe, dist::split::At<2>>;
    S whole({.micro_batches = 1});
    const auto w1 = trained<prec::MixedBFloat16>(whole, opt, 2)->get_weights();
    CHECK(max_abs_diff(w1, ref) <= 1e-6);
    S split({.micro_batches = 3});
    const auto w3 = trained<prec::MixedBFloat16>(split, opt, 2)->get_weights();
    CHECK(max_abs_diff(w3, ref) < 1e-3);
    dist::OneDevice<> f32;
    CHECK(max_abs_diff(trained<prec::Float32>(f32, opt, 2)->get_weights(), ref) > 1e-4);  // the policy is in force
}

TEST_CASE("MixedBFloat16 under ParameterServer (synchronous, virtual clock): trains, and the policy is in force") {
    namespace ss = strata::sync;
    auto train = [](auto prec_tag) {
        using Prec = decltype(prec_tag);
        dist::ParameterServer<strata::place::Host, ss::Synchronous> ps(2, 1, {.clock = dist::Clock::Virtual});
        strata::Model<ImgNet, decltype(ps), Prec> m(ps, 7);
        m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
        const auto h = m.fit(images(48, 5).batch(12), {.epochs = 3, .verbose = 0});
        return std::pair{m.get_weights(), h.history.at("loss")};
    };
    const auto [wb, lb] = train(prec::MixedBFloat16{});
    const auto [w32, l32] = train(prec::Float32{});
    CHECK(lb.back() < lb.front());
    CHECK(max_abs_diff(wb, w32) > 1e-4);  // bfloat16's rounding, not float32's arithmetic
    CHECK(max_abs_diff(wb, w32) < 0.1);
}
