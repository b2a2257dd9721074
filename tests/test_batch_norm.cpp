// Batch normalization (strata/nn/batch_normalization.hpp): the layer against a float64
// reference written here, its backward against finite differences, its moving statistics, and
// the synchronized form: N replicas (threads meeting in a ReplicaGroup) on the shards of one
// batch compute what one layer computes on the whole batch, for N = 1..4 and shards that do
// not divide; the unsynchronized layer fails that same comparison (the negative control).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <strata/distribute/collective/all_reduce.hpp>
#include <strata/distribute/slice.hpp>
#include <strata/nn/layers.hpp>

using strata::Shape;
using strata::StaticShape;
using strata::TensorView;
using namespace strata::nn;
namespace coll = strata::distribute::collective;
using Host = strata::place::Host;

namespace {

constexpr std::int64_t H = 3, W = 2, C = 4;
using In = StaticShape<H, W, C>;
using Plain = BatchNormalization<>::bind<In, double, Host>;
using Synced = SyncBatchNormalization<>::bind<In, double, Host>;

std::vector<double> random_values(std::size_t n, std::uint64_t seed, double mean = 0.0, double spread = 1.0) {
    std::mt19937_64 g(seed);
    std::normal_distribution<double> d(mean, spread);
    std::vector<double> v(n);
    for (auto& x : v) x = d(g);
    return v;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0;
    for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

// The reference: per channel mean and biased variance over rows, y = gamma (x - mean) / sqrt(var + eps) + beta.
struct Reference {
    std::vector<double> y, mean, var;
};
Reference reference(const std::vector<double>& x, const std::vector<double>& params, std::int64_t n, double eps) {
    const std::int64_t rows = n * H * W;
    Reference r;
    r.mean.assign(C, 0);
    r.var.assign(C, 0);
    for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t c = 0; c < C; ++c) r.mean[c] += x[i * C + c] / double(rows);
    for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t c = 0; c < C; ++c) r.var[c] += (x[i * C + c] - r.mean[c]) * (x[i * C + c] - r.mean[c]) / double(rows);
    r.y.resize(x.size());
    for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t c = 0; c < C; ++c)
            r.y[i * C + c] = params[c] * (x[i * C + c] - r.mean[c]) / std::sqrt(r.var[c] + eps) + params[C + c];
    return r;
}

template <class L>
std::vector<double> fresh_params(std::uint64_t seed) {
    std::vector<double> p(L::num_params);
    L().init(p.data(), 1, 0);
    // gamma and beta away from 1 and 0, moving statistics away from 0 and 1
    auto g = random_values(4 * C, seed);
    for (std::int64_t c = 0; c < C; ++c) {
        p[c] = 1.0 + 0.3 * g[c];
        p[C + c] = 0.2 * g[C + c];
        p[2 * C + c] = 0.1 * g[2 * C + c];
        p[3 * C + c] = 1.0 + 0.2 * std::abs(g[3 * C + c]);
    }
    return p;
}

// One layer's training pass on x with the loss sum(w · y): returns y, dx and the gradients.
struct Pass {
    std::vector<double> y, dx, grads;
};
template <class L>
Pass train_pass(L& layer, const std::vector<double>& params, const std::vector<double>& x, const std::vector<double>& w,
                std::int64_t n, const Mode& mode, bool want_dx = true) {
    Pass p;
    p.y.assign(x.size(), 0);
    p.dx.assign(x.size(), 0);
    p.grads.assign(params.size(), 0);
    const Shape s = In::batched(n);
    auto xv = TensorView<double, Host>(const_cast<double*>(x.data()), s);
    auto yv = TensorView<double, Host>(p.y.data(), s);
    layer.forward(params.data(), xv, yv, mode);
    std::vector<double> dy = w;
    layer.backward(params.data(), p.grads.data(), xv, yv, TensorView<double, Host>(dy.data(), s),
                   want_dx ? TensorView<double, Host>(p.dx.data(), s) : TensorView<double, Host>(), mode);
    return p;
}

}  // namespace

TEST_CASE("BatchNormalization: Keras' variables, order and defaults") {
    static_assert(Plain::num_params == 4 * C);
    const auto info = Plain::param_info();
    REQUIRE(info.size() == 4);
    CHECK(info[0].name == "gamma");
    CHECK(info[1].name == "beta");
    CHECK(info[2].name == "moving_mean");
    CHECK(info[3].name == "moving_variance");
    CHECK(info[0].trainable);
    CHECK(info[1].trainable);
    CHECK_FALSE(info[2].trainable);
    CHECK_FALSE(info[3].trainable);
    CHECK(info[2].momentum == 0.99);
    std::vector<double> p(Plain::num_params, -5);
    Plain().init(p.data(), 7, 3);
    for (std::int64_t c = 0; c < C; ++c) {
        CHECK(p[c] == 1.0);
        CHECK(p[C + c] == 0.0);
        CHECK(p[2 * C + c] == 0.0);
        CHECK(p[3 * C + c] == 1.0);
    }
    using NoAffine = BatchNormalization<BatchNormOptions{.center = false, .scale = false}>::bind<In, double, Host>;
    static_assert(NoAffine::num_params == 2 * C);
    CHECK(NoAffine::param_info()[0].name == "moving_mean");

    using Net = Sequential<Input<H, W, C>, BatchNormalization<>, Flatten, Dense<3, Softmax>>;
    CHECK(Net::num_non_trainable() == 2 * C);
    const std::string s = Net::summary();
    CHECK(s.find("Non-trainable params: 8") != std::string::npos);
    CHECK(s.find("Trainable params: " + std::to_string(Net::num_params - 8)) != std::string::npos);
    CHECK(s.find("batch_normalization (BatchNormalization)") != std::string::npos);
    const auto spans = Net::moving_averages();
    REQUIRE(spans.size() == 1);
    CHECK(spans[0].first == 2 * C);
    CHECK(spans[0].count == 2 * C);
    CHECK(spans[0].momentum == 0.99);
    static_assert(!Net::synchronizes_replicas);
    static_assert(Sequential<Input<H, W, C>, SyncBatchNormalization<>>::synchronizes_replicas);
}

TEST_CASE("BatchNormalization: training forward against the float64 reference, away from zero mean") {
    const std::int64_t n = 5;
    struct Case {
        double mean, spread, moving_mean;
    };
    // A mean 50 spreads from zero with a fresh moving mean (0); a mean of 1000 against a spread of
    // 0.01 once the moving mean (the shift of the sums) has come near it: in both, the variance
    // keeps 12 digits (naive float sums of squares would keep none in the second).
    for (const Case k : {Case{50.0, 1.0, 0.0}, Case{1000.0, 0.01, 999.99}}) {
        CAPTURE(k.mean);
        const auto x = random_values(std::size_t(n * In::size), 11, k.mean, k.spread);
        auto params = fresh_params<Plain>(3);
        for (std::int64_t c = 0; c < C; ++c) params[2 * C + c] = k.moving_mean;
        const auto w = random_values(x.size(), 12);
        Plain layer;
        const auto p = train_pass(layer, params, x, w, n, Mode{.training = true});
        const auto ref = reference(x, params, n, 1e-3);
        CHECK(max_abs_diff(p.y, ref.y) < 1e-11);
        for (std::int64_t c = 0; c < C; ++c) {
            const double var_tol = 1e-12 * ref.var[c];
            CHECK(std::abs(layer.batch_mean()[c] - ref.mean[c]) < 1e-12 * k.mean);
            CHECK(std::abs(layer.batch_variance()[c] - ref.var[c]) < var_tol);
            // the moving statistics' slots hold the batch's (one device: weight 1)
            CHECK(std::abs(p.grads[2 * C + c] - ref.mean[c]) < 1e-12 * k.mean);
            CHECK(std::abs(p.grads[3 * C + c] - ref.var[c]) < var_tol);
        }
    }
}

TEST_CASE("BatchNormalization: inference uses the moving statistics") {
    const std::int64_t n = 3;
    const auto x = random_values(std::size_t(n * In::size), 21);
    const auto params = fresh_params<Plain>(4);
    Plain layer;
    std::vector<double> y(x.size());
    layer.forward(params.data(), TensorView<double, Host>(const_cast<double*>(x.data()), In::batched(n)),
                  TensorView<double, Host>(y.data(), In::batched(n)), Mode{.training = false});
    for (std::int64_t i = 0; i < n * H * W; ++i)
        for (std::int64_t c = 0; c < C; ++c) {
            const double want = params[c] * (x[i * C + c] - params[2 * C + c]) / std::sqrt(params[3 * C + c] + 1e-3) + params[C + c];
            CHECK(std::abs(y[i * C + c] - want) < 1e-12);
        }
}

TEST_CASE("BatchNormalization: backward against finite differences (training statistics)") {
    const std::int64_t n = 2;
    auto x = random_values(std::size_t(n * In::size), 31);
    auto params = fresh_params<Plain>(5);
    const auto w = random_values(x.size(), 32);
    Plain layer;
    const auto p = train_pass(layer, params, x, w, n, Mode{.training = true});
    auto loss = [&](const std::vector<double>& xx, const std::vector<double>& pp) {
        Plain l;
        std::vector<double> y(xx.size());
        l.forward(pp.data(), TensorView<double, Host>(const_cast<double*>(xx.data()), In::batched(n)),
                  TensorView<double, Host>(y.data(), In::batched(n)), Mode{.training = true});
        double s = 0;
        for (std::size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
        return s;
    };
    const double h = 1e-6;
    for (std::size_t i = 0; i < x.size(); ++i) {
        auto a = x, b = x;
        a[i] += h;
        b[i] -= h;
        const double fd = (loss(a, params) - loss(b, params)) / (2 * h);
        CHECK(std::abs(fd - p.dx[i]) < 1e-6 * std::max(1.0, std::abs(fd)));
    }
    for (std::int64_t i = 0; i < 2 * C; ++i) {  // gamma, beta (the moving statistics are not trained)
        auto a = params, b = params;
        a[std::size_t(i)] += h;
        b[std::size_t(i)] -= h;
        const double fd = (loss(x, a) - loss(x, b)) / (2 * h);
        CHECK(std::abs(fd - p.grads[std::size_t(i)]) < 1e-6 * std::max(1.0, std::abs(fd)));
    }
}

TEST_CASE("BatchNormalization: backward after an inference forward is the affine map's, and keeps the moving statistics") {
    const std::int64_t n = 2;
    const auto x = random_values(std::size_t(n * In::size), 41);
    const auto params = fresh_params<Plain>(6);
    const auto w = random_values(x.size(), 42);
    Plain layer;
    const auto p = train_pass(layer, params, x, w, n, Mode{.training = false});
    for (std::int64_t i = 0; i < n * H * W; ++i)
        for (std::int64_t c = 0; c < C; ++c)
            CHECK(std::abs(p.dx[i * C + c] - w[i * C + c] * params[c] / std::sqrt(params[3 * C + c] + 1e-3)) < 1e-12);
    for (std::int64_t c = 0; c < C; ++c) {
        CHECK(p.grads[2 * C + c] == doctest::Approx(params[2 * C + c]).epsilon(1e-14));
        CHECK(p.grads[3 * C + c] == doctest::Approx(params[3 * C + c]).epsilon(1e-14));
    }
}

namespace {

// N replicas, each a layer on its contiguous shard of the n examples (as split_batch cuts a
// global batch), meeting in a ReplicaGroup: the summed gradients (what the strategy's
// all-reduce gives), and each replica's y and dx put back in batch order.
template <class L>
Pass replicas_pass(int replicas, const std::vector<double>& params, const std::vector<double>& x, const std::vector<double>& w,
                   std::int64_t n) {
    coll::ReplicaGroup group(replicas, {std::chrono::milliseconds(20000)});
    std::vector<Pass> parts(static_cast<std::size_t>(replicas));
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(replicas));
    std::vector<std::thread> threads;
    for (int r = 0; r < replicas; ++r)
        threads.emplace_back([&, r] {
            try {
                const auto sl = strata::distribute::replica_slice(n, replicas, r);
                const std::size_t per = std::size_t(In::size);
                const std::vector<double> xs(x.begin() + std::ptrdiff_t(sl.first * per), x.begin() + std::ptrdiff_t((sl.first + sl.count) * per));
                const std::vector<double> ws(w.begin() + std::ptrdiff_t(sl.first * per), w.begin() + std::ptrdiff_t((sl.first + sl.count) * per));
                auto sum = [&](std::span<double> v) { group.all_reduce(r, v, coll::ReduceOp::Sum); };
                Mode mode{.training = true, .first_example = sl.first, .global_examples = n, .replica_sum = sum};
                L layer;
                if (sl.count == 0) {
                    parts[std::size_t(r)].grads.assign(params.size(), 0);
                    layer.join_forward(params.data(), mode);
                    layer.join_backward(parts[std::size_t(r)].grads.data(), mode);
                } else {
                    parts[std::size_t(r)] = train_pass(layer, params, xs, ws, sl.count, mode);
                }
            } catch (...) {
                errors[std::size_t(r)] = std::current_exception();
            }
        });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
    Pass all;
    all.grads.assign(params.size(), 0);
    for (auto& p : parts) {
        all.y.insert(all.y.end(), p.y.begin(), p.y.end());
        all.dx.insert(all.dx.end(), p.dx.begin(), p.dx.end());
        for (std::size_t i = 0; i < p.grads.size(); ++i) all.grads[i] += p.grads[i];
    }
    return all;
}

}  // namespace

TEST_CASE("SyncBatchNormalization: N replicas on the shards of a batch equal one device on the whole batch (float64, 1e-12)") {
    const auto params = fresh_params<Plain>(7);
    for (const std::int64_t n : {4, 7, 3}) {  // 7 and 3 do not divide among 2..4 replicas (3 leaves one empty at 4)
        const auto x = random_values(std::size_t(n * In::size), 50 + std::uint64_t(n), 0.5, 2.0);
        const auto w = random_values(x.size(), 60 + std::uint64_t(n));
        Synced one;
        const auto want = train_pass(one, params, x, w, n, Mode{.training = true});
        for (int replicas = 1; replicas <= 4; ++replicas) {
            CAPTURE(n);
            CAPTURE(replicas);
            const auto got = replicas_pass<Synced>(replicas, params, x, w, n);
            CHECK(max_abs_diff(got.y, want.y) < 1e-12);
            CHECK(max_abs_diff(got.dx, want.dx) < 1e-12);
            CHECK(max_abs_diff(got.grads, want.grads) < 1e-12);
        }
    }
}

TEST_CASE("BatchNormalization without synchronization fails that comparison (negative control)") {
    const auto params = fresh_params<Plain>(8);
    const std::int64_t n = 7;
    const auto x = random_values(std::size_t(n * In::size), 71, 0.5, 2.0);
    const auto w = random_values(x.size(), 72);
    Plain one;
    const auto want = train_pass(one, params, x, w, n, Mode{.training = true});
    const auto got = replicas_pass<Plain>(2, params, x, w, n);
    CHECK(max_abs_diff(got.y, want.y) > 1e-3);
    CHECK(max_abs_diff(got.dx, want.dx) > 1e-3);
    // its moving mean's slot is still the global batch's mean (the shards' means weighted by
    // their sizes); the variance's is not (the within-shard variances miss the between-shard part)
    for (std::int64_t c = 0; c < C; ++c) CHECK(std::abs(got.grads[2 * C + c] - want.grads[2 * C + c]) < 1e-12);
    double var_gap = 0;
    for (std::int64_t c = 0; c < C; ++c) var_gap = std::max(var_gap, std::abs(got.grads[3 * C + c] - want.grads[3 * C + c]));
    CHECK(var_gap > 1e-4);
}

TEST_CASE("ActivationLayer: forward is the activation, backward matches finite differences") {
    using L = ActivationLayer<Tanh>::bind<In, double, Host>;
    using R = ActivationLayer<ReLU>::bind<In, double, Host>;
    const std::int64_t n = 2;
    const auto x = random_values(std::size_t(n * In::size), 81);
    const auto w = random_values(x.size(), 82);
    L layer;
    const auto p = train_pass(layer, std::vector<double>{}, x, w, n, Mode{.training = true});
    for (std::size_t i = 0; i < x.size(); ++i) CHECK(p.y[i] == std::tanh(x[i]));
    const double h = 1e-6;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double fd = w[i] * (std::tanh(x[i] + h) - std::tanh(x[i] - h)) / (2 * h);
        CHECK(std::abs(fd - p.dx[i]) < 1e-8);
    }
    R relu;
    const auto q = train_pass(relu, std::vector<double>{}, x, w, n, Mode{.training = true});
    for (std::size_t i = 0; i < x.size(); ++i) {
        CHECK(q.y[i] == std::max(x[i], 0.0));
        CHECK(q.dx[i] == (x[i] > 0 ? w[i] : 0.0));
    }
    static_assert(L::num_params == 0);
}

TEST_CASE("SyncBatchNormalization: a replica that never reaches the layer's sum is named by the deadline, never a hang") {
    coll::ReplicaGroup group(3, {std::chrono::milliseconds(200)});
    const auto params = fresh_params<Synced>(9);
    const auto x = random_values(std::size_t(2 * In::size), 91);
    std::vector<std::string> errors(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r)
        threads.emplace_back([&, r] {
            if (r == 2) return;  // skips its forward pass (a rank out of step)
            try {
                auto sum = [&](std::span<double> v) { group.all_reduce(r, v, coll::ReduceOp::Sum); };
                Synced layer;
                std::vector<double> y(x.size());
                layer.forward(params.data(), TensorView<double, Host>(const_cast<double*>(x.data()), In::batched(2)),
                              TensorView<double, Host>(y.data(), In::batched(2)),
                              Mode{.training = true, .global_examples = 6, .replica_sum = sum});
            } catch (const strata::Error& e) {
                errors[std::size_t(r)] = e.what();
            }
        });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
        CAPTURE(r);
        CHECK(errors[std::size_t(r)].find("replica 2 of 3 did not arrive within 200 ms") != std::string::npos);
    }
}

TEST_CASE("BatchNormalization's passes: the GPU's element forms equal the host's row forms, bit for bit") {
    // The layer runs its affine map and its input gradient as blocks of whole rows on the host
    // (the channel is the position in the row) and as one element per index on a GPU (the
    // channel is i % C, C a compile-time constant). Both are plain functors: the element forms
    // run here over every index, with 32-bit and 64-bit indices, against the row forms, on a
    // row count that leaves a partial last block. Outputs start as NaN: an element never
    // written fails.
    constexpr std::int64_t Ch = 24;
    const std::int64_t rows = 3 * strata::nn::detail::bn_block_rows<Ch> + 7, n = rows * Ch;
    const auto x64 = random_values(std::size_t(n), 501), dy64 = random_values(std::size_t(n), 502);
    const auto c64 = random_values(std::size_t(5 * Ch), 503, 0.5, 1.0);
    std::vector<float> x(x64.begin(), x64.end()), dy(dy64.begin(), dy64.end()), coef(c64.begin(), c64.end());
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto rows_of = [&](auto f) {
        constexpr std::int64_t block = strata::nn::detail::bn_block_rows<Ch>;
        for (std::int64_t u = 0; u < (rows + block - 1) / block; ++u) f(u);
    };
    std::vector<float> by_rows(std::size_t(n), nan), by_elements32(std::size_t(n), nan), by_elements64(std::size_t(n), nan);
    rows_of(strata::nn::detail::BnAffineRows<float, Ch>{x.data(), by_rows.data(), coef.data(), coef.data() + Ch, rows});
    const strata::nn::detail::BnAffine<float, Ch> affine32{x.data(), by_elements32.data(), coef.data(), coef.data() + Ch};
    const strata::nn::detail::BnAffine<float, Ch> affine64{x.data(), by_elements64.data(), coef.data(), coef.data() + Ch};
    for (std::int64_t i = 0; i < n; ++i) {
        affine32(std::int32_t(i));
        affine64(i);
    }
    CHECK(std::memcmp(by_rows.data(), by_elements32.data(), sizeof(float) * std::size_t(n)) == 0);
    CHECK(std::memcmp(by_rows.data(), by_elements64.data(), sizeof(float) * std::size_t(n)) == 0);
    CHECK(std::none_of(by_rows.begin(), by_rows.end(), [](float v) { return std::isnan(v); }));

    std::fill(by_rows.begin(), by_rows.end(), nan);
    std::fill(by_elements32.begin(), by_elements32.end(), nan);
    rows_of(strata::nn::detail::BnInputGradRows<float, Ch>{x.data(), dy.data(), by_rows.data(), coef.data(), rows});
    const strata::nn::detail::BnInputGrad<float, Ch> grad{x.data(), dy.data(), by_elements32.data(), coef.data()};
    for (std::int64_t i = 0; i < n; ++i) grad(std::int32_t(i));
    CHECK(std::memcmp(by_rows.data(), by_elements32.data(), sizeof(float) * std::size_t(n)) == 0);
    CHECK(std::none_of(by_rows.begin(), by_rows.end(), [](float v) { return std::isnan(v); }));
}
