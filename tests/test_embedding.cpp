// Embedding (issue 43): the lookup against a float64 reference, its backward against finite
// differences and against a plain scatter-add with repeated ids, the id errors (their message
// checked), determinism across thread counts, Keras' variable and initializer, the ids under a
// mixed precision policy (not rounded: a negative control shows what rounding would do),
// per-token sparse cross-entropy and accuracy, and a small causal sequence task through the
// data pipeline: next-token prediction that a causal transformer learns, and a random next
// token it cannot (near 1/V) while the same model without the causal mask reads it from the
// future (the mask blocks the future).
//
// The cases templated on the place also run on Cuda when this file is compiled by nvcc
// (test_embedding.cu); the host is the oracle. Training through Model is host-only here.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <strata/loss/losses.hpp>
#include <strata/metrics/accuracy.hpp>
#include <strata/metrics/metric.hpp>
#include <strata/nn/layers.hpp>

#include "test_places.hpp"

#if !defined(__CUDACC__)
#include <strata/strata.hpp>
#include <strata/distribute/tensor_parallel_attention.hpp>
#include <strata/distribute/pipeline.hpp>

#include "training_util.hpp"
#endif

using strata::Shape;
using strata::StaticShape;
using strata::Tensor;
using strata::TensorView;
using namespace strata::nn;
using strata_test::reference_values;

namespace {

using Host = strata::place::Host;

template <class T, class P>
Tensor<T, P> on_place(const std::vector<double>& v, const Shape& shape) {
    std::vector<T> t(v.begin(), v.end());
    return strata::copy_to<P>(strata::from_vector(t, shape).view());
}

template <class T, class P>
std::vector<double> as_double(const TensorView<T, P>& t) {
    auto v = strata::to_vector(t);
    return std::vector<double>(v.begin(), v.end());
}

// n × S ids in [0, V), drawn reproducibly; `repeat` folds them onto the first V / 4 ids so that
// many tokens share a row.
std::vector<double> token_ids(std::int64_t count, std::int64_t V, std::uint64_t seed, bool repeat = false) {
    const auto u = reference_values(count, seed, 0, 1);
    std::vector<double> ids(static_cast<std::size_t>(count));
    const std::int64_t range = repeat ? std::max<std::int64_t>(1, V / 4) : V;
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = double(std::min<std::int64_t>(range - 1, std::int64_t(u[i] * double(range))));
    return ids;
}

// The reference lookup: y[t, d] = E[ids[t], d], in float64.
std::vector<double> lookup_ref(const std::vector<double>& ids, const std::vector<double>& e, std::int64_t D) {
    std::vector<double> y(ids.size() * std::size_t(D));
    for (std::size_t t = 0; t < ids.size(); ++t)
        for (std::int64_t d = 0; d < D; ++d) y[t * std::size_t(D) + std::size_t(d)] = e[std::size_t(std::int64_t(ids[t]) * D + d)];
    return y;
}
// The reference scatter-add: g[v, d] = Σ_{t: ids[t] = v} dy[t, d], token by token, in float64.
std::vector<double> scatter_ref(const std::vector<double>& ids, const std::vector<double>& dy, std::int64_t V, std::int64_t D) {
    std::vector<double> g(std::size_t(V * D), 0.0);
    for (std::size_t t = 0; t < ids.size(); ++t)
        for (std::int64_t d = 0; d < D; ++d) g[std::size_t(std::int64_t(ids[t]) * D + d)] += dy[t * std::size_t(D) + std::size_t(d)];
    return g;
}

/// Forward (and, given dy, backward) of Embedding<V, D> on [n, S] ids, on place P in type T.
template <std::int64_t V, std::int64_t D, std::int64_t S, class T, class P>
struct EmbeddingRun {
    using L = typename Embedding<V, D>::template bind<StaticShape<S>, T, P>;
    L layer{};
    std::vector<double> y, dx, g;
    void run(const std::vector<double>& params, const std::vector<double>& ids, const std::vector<double>* dy = nullptr) {
        const std::int64_t n = std::int64_t(ids.size()) / S;
        auto p = on_place<T, P>(params, Shape{V * D});
        auto x = on_place<T, P>(ids, Shape{n, S});
        Tensor<T, P> out(Shape{n, S, D});
        layer.forward(p.data(), x.view(), out.view(), Mode{});
        y = as_double(out.view());
        if (!dy) return;
        auto dyt = on_place<T, P>(*dy, Shape{n, S, D});
        Tensor<T, P> dxt(Shape{n, S}), gt(Shape{V * D});
        strata::fill(dxt.view(), T(7));
        strata::fill(gt.view(), T(12345));  // backward must overwrite every slot
        layer.backward(p.data(), gt.data(), x.view(), out.view(), dyt.view(), dxt.view(), Mode{});
        dx = as_double(dxt.view());
        g = as_double(gt.view());
    }
};

// The message of the ValueError `f` throws ("" and a failed check when it throws none).
template <class F>
std::string value_error_of(F f) {
    try {
        f();
    } catch (const strata::ValueError& e) {
        return e.what();
    }
    FAIL("no strata::ValueError");
    return "";
}

}  // namespace

TEST_CASE_TEMPLATE("Embedding looks up each id's row: float64 reference, repeated ids, the first and last rows, on every place", P,
                   STRATA_TEST_PLACES) {
    constexpr std::int64_t V = 11, D = 5, S = 7;
    const auto e = reference_values(V * D, 1, -2, 2);
    SUBCASE("random ids, float64") {
        auto ids = token_ids(3 * S, V, 2);
        ids[0] = 0;
        ids[1] = V - 1;  // both ends of the table
        EmbeddingRun<V, D, S, double, P> r;
        r.run(e, ids);
        CHECK(r.y == lookup_ref(ids, e, D));  // a copy: exact
    }
    SUBCASE("float, every token the same id") {
        const std::vector<double> ids(std::size_t(2 * S), 4.0);
        EmbeddingRun<V, D, S, float, P> r;
        r.run(e, ids);
        std::vector<double> ef(e.size());
        for (std::size_t i = 0; i < e.size(); ++i) ef[i] = double(float(e[i]));
        CHECK(r.y == lookup_ref(ids, ef, D));
    }
    SUBCASE("a batch of 0 examples") {
        EmbeddingRun<V, D, S, double, P> r;
        r.run(e, {});
        CHECK(r.y.empty());
    }
}

TEST_CASE_TEMPLATE("Embedding backward is the scatter-add of dy into the rows used (repeated ids summed), no input gradient; on every place",
                   P, STRATA_TEST_PLACES) {
    constexpr std::int64_t V = 16, D = 3, S = 9;
    const std::int64_t n = 5;
    const auto e = reference_values(V * D, 3);
    const auto ids = token_ids(n * S, V, 4, /*repeat=*/true);  // ids 0..3 only: rows 4..15 unused
    const auto dy = reference_values(n * S * D, 5);
    EmbeddingRun<V, D, S, double, P> r;
    r.run(e, ids, &dy);
    const auto ref = scatter_ref(ids, dy, V, D);
    double diff = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) diff = std::max(diff, std::abs(r.g[i] - ref[i]));
    CHECK(diff <= 1e-14);
    for (std::size_t i = 4 * D; i < std::size_t(V * D); ++i) CHECK(r.g[i] == 0.0);  // unused rows: exactly 0
    CHECK(std::count(ids.begin(), ids.end(), 0.0) > 1);                             // a row really is shared
    CHECK(std::all_of(r.dx.begin(), r.dx.end(), [](double v) { return v == 0.0; }));
    // Negative control: the last write per row (an assignment, not a sum) is not the gradient.
    std::vector<double> last(std::size_t(V * D), 0.0);
    for (std::size_t t = 0; t < ids.size(); ++t)
        for (std::int64_t d = 0; d < D; ++d) last[std::size_t(std::int64_t(ids[t]) * D + d)] = dy[t * D + std::size_t(d)];
    double far = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) far = std::max(far, std::abs(last[i] - r.g[i]));
    CHECK(far > 0.1);
}

TEST_CASE("Embedding gradients match finite differences of sum(w ⊙ y) w.r.t. every entry of the table") {
    constexpr std::int64_t V = 6, D = 4, S = 5;
    auto e = reference_values(V * D, 6);
    const auto ids = token_ids(3 * S, V, 7, true);
    const auto w = reference_values(3 * S * D, 8);
    EmbeddingRun<V, D, S, double, Host> r;
    r.run(e, ids, &w);
    const auto g = r.g;
    auto f = [&] {
        EmbeddingRun<V, D, S, double, Host> q;
        q.run(e, ids);
        double s = 0;
        for (std::size_t i = 0; i < w.size(); ++i) s += w[i] * q.y[i];
        return s;
    };
    double err = 0, scale = 0;
    for (std::size_t i = 0; i < e.size(); ++i) {
        const double old = e[i];
        e[i] = old + 1e-6;
        const double fp = f();
        e[i] = old - 1e-6;
        const double fm = f();
        e[i] = old;
        err = std::max(err, std::abs((fp - fm) / 2e-6 - g[i]));
        scale = std::max(scale, std::abs(g[i]));
    }
    INFO("largest error " << err << " against the gradient's scale " << scale);
    CHECK(scale > 0.5);
    CHECK(err <= 1e-8 * scale);
}

TEST_CASE("Embedding's id errors: not an integer, negative, the vocabulary size or more, NaN; the message names the id, example, token and vocabulary") {
    constexpr std::int64_t V = 10, D = 2, S = 4;
    const auto e = reference_values(V * D, 9);
    auto ids = token_ids(3 * S, V, 10);
    auto message_for = [&](double bad, std::size_t at) {
        auto x = ids;
        x[at] = bad;
        return value_error_of([&] {
            EmbeddingRun<V, D, S, double, Host> r;
            r.run(e, x);
        });
    };
    {
        const auto m = message_for(10, 6);  // example 1, token 2
        INFO(m);
        CHECK(strata_test::has(m, "Embedding<10, 2>"));
        CHECK(strata_test::has(m, "token id 10 at example 1, token 2"));
        CHECK(strata_test::has(m, "[0, 10)"));
        CHECK(strata_test::has(m, "vocabulary size is 10"));
    }
    CHECK(strata_test::has(message_for(-1, 0), "token id -1 at example 0, token 0"));
    CHECK(strata_test::has(message_for(2.5, 11), "token id 2.5 at example 2, token 3"));
    CHECK(strata_test::has(message_for(std::numeric_limits<double>::quiet_NaN(), 3), "token id nan at example 0, token 3"));
    CHECK(strata_test::has(message_for(1e9, 5), "token id 1e+09 at example 1, token 1"));
    // The largest id and 0 are fine (positive control).
    ids[0] = 9;
    ids[1] = 0;
    EmbeddingRun<V, D, S, double, Host> r;
    r.run(e, ids);
    CHECK(r.y.size() == std::size_t(3 * S * D));
}

TEST_CASE("Embedding's gradient is the same bit for bit on 1, 2, 3 and 8 threads (no atomics, a fixed order per row)") {
    constexpr std::int64_t V = 37, D = 24, S = 16;
    const std::int64_t n = 64;
    const auto e = reference_values(V * D, 11);
    const auto ids = token_ids(n * S, V, 12, true);  // 9 ids over 1024 tokens: long sums per row
    const auto dy = reference_values(n * S * D, 13, -1e3, 1e3);
    const int before = strata::num_threads();
    std::vector<std::vector<double>> grads;
    for (int threads : {1, 2, 3, 8}) {
        strata::set_num_threads(threads);
        EmbeddingRun<V, D, S, float, Host> r;  // float: a different order would change the sums' bits
        r.run(e, ids, &dy);
        grads.push_back(r.g);
    }
    strata::set_num_threads(before);
    for (std::size_t i = 1; i < grads.size(); ++i) CHECK(grads[i] == grads[0]);
    // The sums are long enough for order to matter: float's sum of a row in reverse differs.
    const auto ref = scatter_ref(ids, dy, V, D);
    float fwd = 0, rev = 0;
    std::vector<float> terms;
    for (std::size_t t = 0; t < ids.size(); ++t)
        if (ids[t] == 0) terms.push_back(float(dy[t * D]));
    for (float v : terms) fwd += v;
    for (auto it = terms.rbegin(); it != terms.rend(); ++it) rev += *it;
    CHECK(terms.size() > 50);
    CHECK(std::abs(double(grads[0][0]) - ref[0]) <= 1e-3 * std::abs(ref[0]) + 1e-3);
    INFO("float sum in order " << fwd << ", reversed " << rev);
}

TEST_CASE("Embedding: Keras' variable, uniform(-0.05, 0.05) from the seed, summary, integer_input") {
    using L = Embedding<1000, 64>::bind<StaticShape<12>, float, Host>;
    const auto info = L::param_info();
    REQUIRE(info.size() == 1);
    CHECK(info[0].name == "embeddings");
    CHECK(info[0].shape == Shape{1000, 64});
    CHECK(L::num_params == 64000);
    CHECK(std::is_same_v<L::output_shape, StaticShape<12, 64>>);
    static_assert(takes_integer_input<L>() && !takes_integer_input<Dense<4>::bind<StaticShape<3>, float, Host>>());
    std::vector<float> p(std::size_t(L::num_params), 9.0f), q(p.size(), 9.0f), other(p.size(), 9.0f);
    L().init(p.data(), 5, 16);
    L().init(q.data(), 5, 16);
    L().init(other.data(), 6, 16);
    CHECK(p == q);
    CHECK(p != other);
    double lo = 1, hi = -1, mean = 0;
    for (float v : p) {
        lo = std::min(lo, double(v));
        hi = std::max(hi, double(v));
        mean += v;
    }
    mean /= double(p.size());
    CHECK(lo >= -0.05);
    CHECK(hi <= 0.05);
    CHECK(lo < -0.0499);
    CHECK(hi > 0.0499);
    CHECK(std::abs(mean) < 1e-3);  // uniform: mean 0, sd 0.05/√3 / √64000 ≈ 1.1e-4
    using Net = Sequential<Input<12>, Embedding<1000, 64>, TokenDense<3>>;
    const auto names = Net::layer_names();
    CHECK(names[0] == "embedding");
    const auto params = Net::parameters();
    CHECK(params[0].name == "embedding/embeddings");
#if !defined(__CUDACC__)
    const auto s = Net::summary();
    INFO(s);
    CHECK(strata_test::has(s, "Embedding"));
    CHECK(strata_test::has(s, "(None, 12, 64)"));
    CHECK(strata_test::has(s, "64,000"));
#endif
}

TEST_CASE("under a mixed precision policy the token ids are not rounded: ids up to 1000 give float32's rows (rounded to bfloat16)") {
    using Net = Sequential<Input<6>, Embedding<1024, 4>>;
    Network<Net, float, Host> net;
    std::vector<float> params(std::size_t(Net::num_params));
    net.init(params.data(), 3);
    // Ids bfloat16 cannot hold: bfloat16 keeps 8 significant bits, so 1001 rounds to 1000.
    const std::vector<float> ids{1001, 999, 257, 1023, 513, 3};
    CHECK(strata::round_to<strata::bfloat16>(1001.0f) == 1000.0f);
    CHECK(strata::round_to<strata::float16>(2049.0f) == 2048.0f);
    auto x = strata::from_vector(ids, Shape{1, 6});
    const auto f32 = strata::to_vector(net.forward(params.data(), x.view(), Mode{}));
    const auto bf16 = strata::to_vector(net.forward(params.data(), x.view(), Mode{.compute = strata::precision::Compute::BFloat16}));
    REQUIRE(f32.size() == bf16.size());
    int differ_from_rounded_id = 0;
    for (std::size_t t = 0; t < ids.size(); ++t) {
        for (std::size_t d = 0; d < 4; ++d) {
            const float want = strata::round_to<strata::bfloat16>(params[std::size_t(ids[t]) * 4 + d]);
            CHECK(bf16[t * 4 + d] == want);
            CHECK(f32[t * 4 + d] == params[std::size_t(ids[t]) * 4 + d]);
            // Negative control: the row of the id as bfloat16 would round it (1001 → 1000).
            // (1023 rounds to 1024, outside the table: no row to compare with.)
            const auto rounded_id = std::size_t(strata::round_to<strata::bfloat16>(ids[t]));
            if (rounded_id != std::size_t(ids[t]) && rounded_id < 1024 &&
                bf16[t * 4 + d] != strata::round_to<strata::bfloat16>(params[rounded_id * 4 + d]))
                ++differ_from_rounded_id;
        }
    }
    CHECK(differ_from_rounded_id > 8);
    CHECK(x.data()[0] == 1001.0f);  // the caller's batch is not touched
}

TEST_CASE("SparseCategoricalCrossentropy and accuracy on [n, K, classes] against [n, K] ids: the mean over every token") {
    constexpr std::int64_t n = 3, K = 4, C = 5;
    const auto z = reference_values(n * K * C, 21, -2, 2);
    const auto ids = token_ids(n * K, C, 22);
    auto pred = strata::from_vector(std::vector<double>(z.begin(), z.end()), Shape{n, K, C});
    auto target = strata::from_vector(ids, Shape{n, K});
    Tensor<double, Host> grad(Shape{n, K, C}), grad_rows(Shape{n * K, C});
    for (auto input : {strata::loss::Input::Logits, strata::loss::Input::Probabilities}) {
        auto p = pred.clone();
        if (input == strata::loss::Input::Probabilities)
            for (std::int64_t r = 0; r < n * K; ++r) {
                double s = 0;
                for (std::int64_t c = 0; c < C; ++c) s += (p.data()[r * C + c] = std::exp(z[std::size_t(r * C + c)]));
                for (std::int64_t c = 0; c < C; ++c) p.data()[r * C + c] /= s;
            }
        const double loss = strata::loss::loss_and_grad(strata::loss::Loss{strata::loss::SparseCategoricalCrossentropy{}}, p.view(),
                                                        target.view(), grad.view(), double(n), input);
        // The same rows as n·K examples of one id each, averaged over the n·K of them.
        auto rows = p.view().reshape(Shape{n * K, C});
        auto row_ids = target.view().reshape(Shape{n * K});
        const double loss_rows = strata::loss::loss_and_grad(strata::loss::Loss{strata::loss::SparseCategoricalCrossentropy{}}, rows,
                                                             row_ids, grad_rows.view(), double(n * K), input);
        CHECK(loss / n == doctest::Approx(loss_rows / (n * K)).epsilon(1e-14));
        for (std::int64_t i = 0; i < n * K * C; ++i) CHECK(grad.data()[i] == doctest::Approx(grad_rows.data()[i]).epsilon(1e-14));
    }
    // Accuracy: the share of tokens right. Make example 0 all right, example 1 half, 2 none.
    auto p = strata::from_vector(std::vector<double>(std::size_t(n * K * C), 0.0), Shape{n, K, C});
    for (std::int64_t e = 0; e < n; ++e)
        for (std::int64_t k = 0; k < K; ++k) {
            const auto id = std::int64_t(ids[std::size_t(e * K + k)]);
            const bool right = e == 0 || (e == 1 && k < 2);
            p.data()[(e * K + k) * C + (right ? id : (id + 1) % C)] = 1;
        }
    const double correct = strata::metrics::count_correct(p.view(), target.view(), strata::metrics::AccuracyKind::SparseCategorical);
    CHECK(correct == doctest::Approx(1.5).epsilon(1e-15));
    // Top-k per token: every token a row, against a count of the classes scoring strictly higher.
    for (int k : {1, 2, 4}) {
        CAPTURE(k);
        std::int64_t in = 0;
        for (std::int64_t r = 0; r < n * K; ++r) {
            const double mine = z[std::size_t(r * C + std::int64_t(ids[std::size_t(r)]))];
            std::int64_t higher = 0;
            for (std::int64_t c = 0; c < C; ++c) higher += z[std::size_t(r * C + c)] > mine;
            in += higher < k;
        }
        CHECK(strata::metrics::count_in_top_k(pred.view(), target.view(), k, K) == in);
    }
    CHECK(strata::metrics::count_in_top_k(pred.view(), target.view(), C, K) == n * K);
    // Read as one id per example (the rows of K·C outputs), the K ids do not fit: a ShapeError.
    CHECK_THROWS_AS(strata::metrics::count_in_top_k(pred.view(), target.view(), 2), strata::ShapeError);
    // Targets that fit neither one id per example nor one per token are a ShapeError.
    auto bad = strata::from_vector(std::vector<double>(std::size_t(n * 3), 0.0), Shape{n, 3});
    CHECK_THROWS_AS(strata::loss::loss_and_grad(strata::loss::Loss{strata::loss::SparseCategoricalCrossentropy{}}, pred.view(), bad.view(),
                                                grad.view(), double(n), strata::loss::Input::Logits),
                    strata::ShapeError);
}

#if !defined(__CUDACC__)
namespace {

constexpr std::int64_t kVocab = 8, kTokens = 8;

// n sequences of kTokens + 1 tokens as float-encoded ids (x: the first kTokens, y: the last
// kTokens, the next token at each position) through Dataset::from_arrays with kTokens labels per
// example. `counting`: token t+1 = (token t + 1) mod V from a random start; otherwise every
// token is drawn at random (nothing before a token tells it).
strata::data::Dataset<> next_token_task(std::size_t n, std::uint64_t seed, bool counting) {
    const auto u = strata_test::lcg(n * (kTokens + 1), seed, 0, 1);
    std::vector<float> x(n * kTokens);
    std::vector<std::int32_t> y(n * kTokens);
    for (std::size_t i = 0; i < n; ++i) {
        std::vector<std::int32_t> seq(kTokens + 1);
        for (std::size_t t = 0; t <= kTokens; ++t) {
            const auto r = std::min<std::int32_t>(kVocab - 1, std::int32_t(u[i * (kTokens + 1) + t] * kVocab));
            seq[t] = counting ? (t == 0 ? r : (seq[t - 1] + 1) % std::int32_t(kVocab)) : r;
        }
        for (std::size_t t = 0; t < kTokens; ++t) {
            x[i * kTokens + t] = float(seq[t]);
            y[i * kTokens + t] = seq[t + 1];
        }
    }
    return strata::data::Dataset<>::from_arrays(std::move(x), {std::size_t(kTokens)}, std::move(y), kTokens);
}

// A one-block pre-norm causal transformer (or the same without the mask) over token ids:
// Embedding, a learned position embedding, attention and MLP residual blocks, a per-token
// softmax over the vocabulary.
template <bool Causal>
using SeqNet = Sequential<Input<kTokens>, Embedding<kVocab, 16>, PositionEmbedding<>,
                          Residual<LayerNormalization<>, MultiHeadAttention<2, 8, 0, MultiHeadAttentionOptions{.causal = Causal}>>,
                          Residual<LayerNormalization<>, TokenDense<32, GELU>, TokenDense<16>>, LayerNormalization<>,
                          TokenDense<kVocab, Softmax>>;

template <bool Causal>
strata::Evaluation train_on(bool counting, std::uint64_t seed) {
    strata::Model<SeqNet<Causal>> model(seed);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    model.fit(next_token_task(512, seed + 1, counting).shuffle(512, seed + 2).batch(32), {.epochs = 12, .verbose = 0});
    return model.evaluate(next_token_task(256, seed + 100, counting).batch(64));  // held out
}

}  // namespace

TEST_CASE("token ids through the data pipeline: from_arrays with K labels per example, the per-token loss and accuracy, id errors at fit") {
    using Net = SeqNet<true>;
    strata::Model<Net> model(1);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    auto ds = next_token_task(64, 2, true);
    CHECK(ds.example_size() == std::size_t(kTokens));
    CHECK(ds.y_per_example() == std::size_t(kTokens));
    const auto ev = model.evaluate(ds.batch(16));
    // Accuracy as the share of tokens right, from predict (the mean over every token).
    const auto probs = model.predict(ds.batch(16));
    std::int64_t right = 0, tokens = 0;
    for (const auto& b : ds.batch(64)) {
        for (std::size_t i = 0; i < b.size() * kTokens; ++i) {
            const float* p = probs.data() + i * kVocab;
            const auto best = std::max_element(p, p + kVocab) - p;
            right += best == b.y[i];
            ++tokens;
        }
    }
    CHECK(tokens == 64 * kTokens);
    CHECK(ev.accuracy == doctest::Approx(double(right) / double(tokens)).epsilon(1e-12));
    CHECK(ev.loss == doctest::Approx(std::log(double(kVocab))).epsilon(0.2));  // near uniform at first
    // An id outside the vocabulary at fit time: the ValueError names it.
    std::vector<float> x(std::size_t(2 * kTokens), 1.0f);
    x[std::size_t(kTokens + 3)] = float(kVocab);
    auto bad = strata::data::Dataset<>::from_arrays(std::move(x), {std::size_t(kTokens)}, std::vector<std::int32_t>(2 * kTokens, 0), kTokens);
    const auto m = value_error_of([&] { model.fit(bad.batch(2), {.epochs = 1, .verbose = 0}); });
    INFO(m);
    CHECK(strata_test::has(m, "token id 8 at example 1, token 3"));
    CHECK(strata_test::has(m, "vocabulary size is 8"));
    // A label outside the classes: per token.
    std::vector<std::int32_t> y(std::size_t(2 * kTokens), 0);
    y[5] = std::int32_t(kVocab);
    auto bad_y = strata::data::Dataset<>::from_arrays(std::vector<float>(std::size_t(2 * kTokens), 1.0f), {std::size_t(kTokens)}, std::move(y), kTokens);
    CHECK_THROWS_WITH_AS(model.fit(bad_y.batch(2), {.epochs = 1, .verbose = 0}), doctest::Contains("example 0, token 5"), strata::ValueError);
    // Labels that fit neither one per example nor one per token.
    auto odd = strata::data::Dataset<>::from_arrays(std::vector<float>(std::size_t(2 * kTokens), 1.0f), {std::size_t(kTokens)},
                                                    std::vector<std::int32_t>(6, 0), 3);
    CHECK_THROWS_AS(model.fit(odd.batch(2), {.epochs = 1, .verbose = 0}), strata::ShapeError);
}

TEST_CASE("sparse_top_k_categorical_accuracy on per-token ids: the share of every token whose id is in the top k, as predict gives it") {
    using Net = SeqNet<true>;
    strata::Model<Net> model(4);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01},
                  {"accuracy", strata::metrics::sparse_top_k_categorical_accuracy(3)});
    model.fit(next_token_task(128, 5, true).batch(16), {.epochs = 2, .verbose = 0});
    auto ds = next_token_task(64, 6, true);
    const auto ev = model.evaluate(ds.batch(16));
    const auto probs = model.predict(ds.batch(16));
    std::int64_t in = 0, tokens = 0;
    for (const auto& b : ds.batch(64))
        for (std::size_t i = 0; i < b.size() * kTokens; ++i) {
            const float* p = probs.data() + i * kVocab;
            const float mine = p[std::size_t(b.y[i])];
            in += std::count_if(p, p + kVocab, [&](float v) { return v > mine; }) < 3;
            ++tokens;
        }
    REQUIRE(ev.metrics.count("sparse_top_k_categorical_accuracy") == 1);
    const double top3 = ev.metrics.at("sparse_top_k_categorical_accuracy");
    INFO("top-3 " << top3 << ", accuracy " << ev.accuracy);
    CHECK(top3 == doctest::Approx(double(in) / double(tokens)).epsilon(1e-12));
    CHECK(top3 >= ev.accuracy);
    CHECK(top3 < 1.0);  // two epochs: not every token yet (else the comparison above would be weak)
    // Fit's history carries it per epoch, counted the same way.
    const auto h = model.fit(ds.batch(16), {.epochs = 1, .verbose = 0});
    CHECK(h["sparse_top_k_categorical_accuracy"].size() == 1);
    CHECK(h["sparse_top_k_categorical_accuracy"].back() <= 1.0);
}

TEST_CASE("a causal transformer learns next-token prediction; a random next token stays near 1/V causally, and without the mask the model reads it from the future") {
    const auto counting = train_on<true>(true, 11);
    const auto random_causal = train_on<true>(false, 21);
    const auto random_open = train_on<false>(false, 21);
    MESSAGE("held-out per-token accuracy: counting, causal " << counting.accuracy << "; random next token, causal "
                                                             << random_causal.accuracy << ", without the mask " << random_open.accuracy);
    CHECK(counting.accuracy > 0.95);
    // Chance is 1/V = 0.125; the causal model cannot beat it by more than noise.
    CHECK(random_causal.accuracy < 0.2);
    // Without the mask, position t reads token t+1 from the input: every position but the last
    // ((K - 1)/K = 0.875 of the tokens) can be right.
    CHECK(random_open.accuracy > 0.7);
}

TEST_CASE("per-token targets under Mirrored: two replicas split the [n, K] labels with the examples and end where one device does") {
    using Net = SeqNet<true>;
    const auto opt = strata::optim::SGD{.learning_rate = 0.1};
    strata::Model<Net> one(3);
    one.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    one.fit(next_token_task(96, 8, true).batch(12), {.epochs = 2, .verbose = 0});
    strata::distribute::Mirrored<> two(2);
    strata::Model<Net, strata::distribute::Mirrored<>> m(two, 3);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    m.fit(next_token_task(96, 8, true).batch(12), {.epochs = 2, .verbose = 0});
    const auto a = one.get_weights(), b = m.get_weights();
    REQUIRE(a.size() == b.size());
    double diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, double(std::abs(a[i] - b[i])));
    INFO("largest weight difference " << diff);
    CHECK(diff < 1e-5);  // float32 rounding of the summed gradients
    CHECK(a != std::vector<float>(a.size(), 0.0f));
    const auto ea = one.evaluate(next_token_task(64, 9, true).batch(16)), eb = m.evaluate(next_token_task(64, 9, true).batch(16));
    CHECK(ea.loss == doctest::Approx(eb.loss).epsilon(1e-5));
    CHECK(ea.accuracy == doctest::Approx(eb.accuracy).epsilon(1e-12));
}

TEST_CASE("a sequence model saves and loads its embedding by name") {
    using Net = SeqNet<true>;
    strata::Model<Net> model(4);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    model.fit(next_token_task(64, 5, true).batch(16), {.epochs = 1, .verbose = 0});
    const auto path = strata_test::temp_path("embedding.safetensors");
    model.save(path);
    auto f = strata::io::SafetensorsFile::load(path);
    CHECK(f.contains("embedding/embeddings"));
    CHECK(f.contains("position_embedding/embeddings"));
    strata::Model<Net> other(6);
    other.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    CHECK(other.get_weights() != model.get_weights());
    other.load(path);
    CHECK(other.get_weights() == model.get_weights());
    CHECK(other.evaluate(next_token_task(32, 7, true).batch(16)).loss == model.evaluate(next_token_task(32, 7, true).batch(16)).loss);
    std::filesystem::remove(path);
}
#endif

// ---- Padding: Embedding's mask_zero -------------------------------------------------------------

namespace {
// A pre-norm encoder over 6 ids with id 0 as padding (or not), pooled over the tokens.
template <bool Mask>
using PadNet = Sequential<Input<6>, Embedding<7, 4, EmbeddingOptions{.mask_zero = Mask}>, PositionEmbedding<>,
                          Residual<LayerNormalization<>, MultiHeadAttention<2, 3>>,
                          Residual<LayerNormalization<>, TokenDense<8, GELU>, Dropout<10>, TokenDense<4>>, GlobalAveragePooling1D,
                          Dense<3, Softmax>>;
// Four sequences: padding at the end, padding inside (Keras masks every 0), none, and padding
// only.
const std::vector<double> kPadded = {3, 1, 4, 0, 0, 0,  //
                                     5, 0, 2, 6, 0, 1,  //
                                     1, 2, 3, 4, 5, 6,  //
                                     0, 0, 0, 0, 0, 0};

// The output and the gradients (objective sum(w ⊙ y)) of PadNet<Mask> on kPadded, in training
// mode (the dropout draws), with the table's row 0 (the padding's) set to `row0`.
template <class Net, class T = double, class P = Host>
std::pair<std::vector<double>, std::vector<double>> pad_pass_of(double row0, std::uint64_t seed = 3) {
    Network<Net, T, P> net;
    Tensor<T, P> params(Shape{Net::num_params}), grads(Shape{Net::num_params});
    net.init(params.data(), seed);
    std::vector<T> hp(std::size_t(Net::num_params));
    strata::copy(params.view(), TensorView<T, Host>(hp.data(), Shape{Net::num_params}));
    const auto noise = reference_values(Net::num_params, seed + 1, -0.2, 0.2);
    for (std::size_t i = 0; i < hp.size(); ++i) hp[i] += T(noise[i]);
    for (std::int64_t d = 0; d < 4; ++d) hp[std::size_t(d)] = T(row0 * double(d + 1) + 0.1 * double(d * d));  // embedding/embeddings[0] (not a shift: LayerNormalization would undo it)
    strata::copy(TensorView<T, Host>(hp.data(), Shape{Net::num_params}), params.view());
    auto x = on_place<T, P>(kPadded, Net::input_shape::batched(4));
    const Mode mode{.training = true, .step = 7, .seed = 11};
    const auto y = as_double(net.forward(params.data(), x.view(), mode));
    const auto w = reference_values(4 * 3, seed + 2);
    std::vector<T> wt(w.begin(), w.end());
    strata::copy(TensorView<T, Host>(wt.data(), Shape{4, 3}), net.output_grad());
    net.backward(params.data(), grads.data(), mode);
    return {y, as_double(grads.view())};
}
template <bool Mask, class T = double, class P = Host>
std::pair<std::vector<double>, std::vector<double>> pad_pass(double row0, std::uint64_t seed = 3) {
    return pad_pass_of<PadNet<Mask>, T, P>(row0, seed);
}
// The same encoder with a class token (counted, whatever the padding) read by FirstToken.
template <bool Mask>
using ClsNet = Sequential<Input<6>, Embedding<7, 4, EmbeddingOptions{.mask_zero = Mask}>, ClassToken, PositionEmbedding<>,
                          Residual<LayerNormalization<>, MultiHeadAttention<2, 3>>,
                          Residual<LayerNormalization<>, TokenDense<8, GELU>, TokenDense<4>>, LayerNormalization<>, FirstToken,
                          Dense<3, Softmax>>;
}  // namespace

TEST_CASE("mask_zero with a class token: the class token counts, the padding reaches nothing; without the mask it does") {
    static_assert(Network<ClsNet<true>, double, Host>::mask_prepend_at == 1);
    const auto [y1, g1] = pad_pass_of<ClsNet<true>>(0.3);
    const auto [y2, g2] = pad_pass_of<ClsNet<true>>(-2.0);
    for (double v : y1) CHECK(std::isfinite(v));  // a sequence of padding only: its class token attends to itself
    CHECK(y1 == y2);
    for (std::size_t i = 0; i < 4; ++i) CHECK(g1[i] == 0.0);
    CHECK(std::vector<double>(g1.begin() + 4, g1.end()) == std::vector<double>(g2.begin() + 4, g2.end()));
    const auto [n1, ng1] = pad_pass_of<ClsNet<false>>(0.3);
    const auto [n2, ng2] = pad_pass_of<ClsNet<false>>(-2.0);
    double moved = 0;
    for (std::size_t i = 0; i < n1.size(); ++i) moved = std::max(moved, std::abs(n1[i] - n2[i]));
    INFO("largest output change without the mask: " << moved);
    CHECK(moved > 1e-6);
    CHECK(std::abs(ng1[0]) > 0);
}

TEST_CASE("mask_zero: nothing a padded token holds reaches the output or another variable's gradient; without the mask it does") {
    const auto [y1, g1] = pad_pass<true>(0.3);
    const auto [y2, g2] = pad_pass<true>(-2.0);
    for (double v : y1) CHECK(std::isfinite(v));
    // Bit for bit: the padded keys' weights are exactly 0, the pooling skips the padding.
    CHECK(y1 == y2);
    // The padding's row has no gradient; every other variable's is the same.
    for (std::size_t i = 0; i < 4; ++i) {
        CHECK(g1[i] == 0.0);
        CHECK(g2[i] == 0.0);
    }
    CHECK(std::vector<double>(g1.begin() + 4, g1.end()) == std::vector<double>(g2.begin() + 4, g2.end()));
    CHECK(std::any_of(g1.begin() + 4, g1.end(), [](double v) { return v != 0; }));
    // (The negative control.) Without the mask, row 0 is an ordinary word: it changes every output.
    const auto [n1, ng1] = pad_pass<false>(0.3);
    const auto [n2, ng2] = pad_pass<false>(-2.0);
    for (std::size_t e = 0; e < 4; ++e) {
        CAPTURE(e);
        if (e == 2) continue;  // the sequence without padding
        CHECK(std::abs(n1[e * 3] - n2[e * 3]) > 1e-6);
    }
    CHECK(std::abs(ng1[0]) > 0);
}

namespace {
// A float64 network's initial parameters (seed `init`) moved by uniform noise in ±0.3 (seed
// `noise`), and its inference output on kPadded's four sequences: the set-up of the by-hand
// references below.
template <class Net>
std::pair<std::vector<double>, std::vector<double>> noisy_forward_on_padded(std::uint64_t init, std::uint64_t noise) {
    Network<Net, double, Host> net;
    std::vector<double> p(std::size_t(Net::num_params));
    net.init(p.data(), init);
    const auto moved = reference_values(Net::num_params, noise, -0.3, 0.3);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] += moved[i];
    auto x = on_place<double, Host>(kPadded, Net::input_shape::batched(4));
    return {p, as_double(net.forward(p.data(), x.view(), Mode{}))};
}
// One query's MultiHeadAttention<H, D> output over `keys` (rows of F features), in float64 by
// hand: each head's scaled dot products, their softmax over exactly the keys given, the values,
// the output projection and its bias. `w` is the layer's block; Impl gives its offsets.
template <class Impl>
std::vector<double> attend_by_hand(const double* w, const double* query, const std::vector<const double*>& keys,
                                   std::int64_t F, std::int64_t H, std::int64_t D) {
    auto proj = [&](std::int64_t kernel, std::int64_t bias, const double* tok, std::int64_t h, std::int64_t d) {
        double s = w[bias + h * D + d];
        for (std::int64_t f = 0; f < F; ++f) s += tok[f] * w[kernel + (f * H + h) * D + d];
        return s;
    };
    std::vector<double> out(std::size_t(F), 0.0);
    for (std::int64_t f = 0; f < F; ++f) out[std::size_t(f)] = w[Impl::o_bias + f];
    for (std::int64_t h = 0; h < H; ++h) {
        std::vector<double> sc;
        double m = -1e300;
        for (const double* k : keys) {
            double s = 0;
            for (std::int64_t d = 0; d < D; ++d) s += proj(Impl::q_kernel, Impl::q_bias, query, h, d) * proj(Impl::k_kernel, Impl::k_bias, k, h, d);
            sc.push_back(s / std::sqrt(double(D)));
            m = std::max(m, sc.back());
        }
        double z = 0;
        for (double& s : sc) z += (s = std::exp(s - m));
        for (std::int64_t d = 0; d < D; ++d) {
            double o = 0;
            for (std::size_t j = 0; j < keys.size(); ++j) o += sc[j] / z * proj(Impl::v_kernel, Impl::v_bias, keys[j], h, d);
            for (std::int64_t f = 0; f < F; ++f) out[std::size_t(f)] += o * w[Impl::o_kernel + (h * D + d) * F + f];
        }
    }
    return out;
}
}  // namespace

TEST_CASE("mask_zero: the masked attention and pooling against a float64 reference of the tokens that count") {
    // The attention block alone: ids -> Embedding -> MultiHeadAttention -> mean of the tokens
    // that count, against the same computed here by hand over those tokens only.
    using Net = Sequential<Input<6>, Embedding<7, 4, EmbeddingOptions{.mask_zero = true}>, MultiHeadAttention<2, 3>, GlobalAveragePooling1D>;
    using Impl = std::tuple_element_t<1, Network<Net, double, Host>::Layers>;
    const auto [p, y] = noisy_forward_on_padded<Net>(5, 6);
    const double* emb = p.data();
    const double* w = p.data() + 7 * 4;  // the attention's block
    const std::int64_t F = 4, H = 2, D = 3;
    for (std::int64_t e = 0; e < 4; ++e) {
        std::vector<const double*> keys;  // the tokens that count, and only those
        for (std::int64_t t = 0; t < 6; ++t)
            if (const auto id = std::int64_t(kPadded[std::size_t(e * 6 + t)]); id != 0) keys.push_back(emb + id * F);
        std::vector<double> pooled(F, 0.0);
        for (const double* query : keys) {  // only the tokens that count are pooled, and they attend to those only
            const auto out = attend_by_hand<Impl>(w, query, keys, F, H, D);
            for (std::int64_t f = 0; f < F; ++f) pooled[std::size_t(f)] += out[std::size_t(f)] / double(keys.size());
        }
        for (std::int64_t f = 0; f < F; ++f) {
            CAPTURE(e);
            CHECK(y[std::size_t(e * F + f)] == doctest::Approx(pooled[std::size_t(f)]).epsilon(1e-12));
        }
    }
    // Padding only: every weight of its attention is 0 and its pooled features are 0.
    for (std::int64_t f = 0; f < F; ++f) CHECK(y[std::size_t(3 * F + f)] == 0.0);
}

TEST_CASE("mask_zero with a class token: its query attends to itself and the real tokens, against a float64 reference") {
    // ids -> Embedding -> ClassToken -> MultiHeadAttention -> FirstToken: the class token's output
    // is the attention of its query over the keys that count, which are the class token itself
    // (counted whatever the padding) and the real tokens. Computed here by hand over exactly those:
    // a class token the mask left out would change every example's output, and a sequence of
    // padding only would give the output projection's bias alone (no key to attend to).
    using Net = Sequential<Input<6>, Embedding<7, 4, EmbeddingOptions{.mask_zero = true}>, ClassToken, MultiHeadAttention<2, 3>,
                           FirstToken>;
    using Impl = std::tuple_element_t<2, Network<Net, double, Host>::Layers>;
    const auto [p, y] = noisy_forward_on_padded<Net>(12, 13);
    const std::int64_t F = 4, H = 2, D = 3;
    const double* emb = p.data();
    const double* cls = p.data() + 7 * F;      // the class token (its variable class_token)
    const double* w = p.data() + 7 * F + F;    // the attention's block
    for (std::int64_t e = 0; e < 4; ++e) {
        std::vector<const double*> keys{cls};  // the class token, then the tokens that count
        for (std::int64_t t = 0; t < 6; ++t)
            if (const auto id = std::int64_t(kPadded[std::size_t(e * 6 + t)]); id != 0) keys.push_back(emb + id * F);
        const auto out = attend_by_hand<Impl>(w, cls, keys, F, H, D);
        double away_from_bias = 0;  // the padding-only example attends to its class token: not the bias alone
        for (std::int64_t f = 0; f < F; ++f) {
            CAPTURE(e);
            CHECK(y[std::size_t(e * F + f)] == doctest::Approx(out[std::size_t(f)]).epsilon(1e-12));
            away_from_bias = std::max(away_from_bias, std::abs(y[std::size_t(e * F + f)] - w[Impl::o_bias + f]));
        }
        CHECK(away_from_bias > 1e-3);
    }
}

TEST_CASE("mask_zero: gradients match finite differences, every variable but the padding's row") {
    using Net = PadNet<true>;
    Network<Net, double, Host> net;
    std::vector<double> p(std::size_t(Net::num_params)), g(p.size());
    net.init(p.data(), 8);
    const auto noise = reference_values(Net::num_params, 9, -0.2, 0.2);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
    auto x = on_place<double, Host>(kPadded, Net::input_shape::batched(4));
    const auto w = reference_values(12, 10);
    const Mode mode{.training = true, .step = 2, .seed = 4};  // the dropout's mask is the same in every pass
    auto objective = [&] {
        const auto y = as_double(net.forward(p.data(), x.view(), mode));
        double s = 0;
        for (std::size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
        return s;
    };
    objective();
    std::copy(w.begin(), w.end(), net.output_grad().data());
    net.backward(p.data(), g.data(), mode);
    double worst = 0;
    int checked = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
        const double old = p[i];
        p[i] = old + 1e-6;
        const double fp = objective();
        p[i] = old - 1e-6;
        const double fm = objective();
        p[i] = old;
        const double fd = (fp - fm) / 2e-6;
        const double err = std::abs(fd - g[i]) / std::max(1e-4, std::abs(fd));
        if (i < 4) CHECK(std::abs(fd) < 1e-9);  // the padding's row changes nothing
        if (err > worst) worst = err;
        checked += g[i] != 0;
    }
    INFO("worst relative error " << worst);
    CHECK(worst < 1e-5);
    CHECK(checked > int(p.size()) / 2);
}

TEST_CASE("a token mask that does not cover a layer's tokens is a ValueError naming both counts") {
    // What a custom layer that adds tokens without declaring it would hand the layers after it.
    using Mha = MultiHeadAttention<2, 3>::bind<StaticShape<6, 4>, double, Host>;
    Mha mha;
    std::vector<double> p(std::size_t(Mha::num_params), 0.1);
    auto x = on_place<double, Host>(reference_values(2 * 6 * 4, 1), Shape{2, 6, 4});
    Tensor<double, Host> y(Shape{2, 6, 4});
    const std::vector<double> mask(2 * 5, 1.0);
    Mode mode;
    mode.token_mask = mask.data();
    mode.mask_tokens = 5;
    CHECK_THROWS_WITH_AS(mha.forward(p.data(), x.view(), y.view(), mode),
                         doctest::Contains("MultiHeadAttention: the token mask covers 5 tokens per example and this layer's input has 6"),
                         strata::ValueError);
    mode.mask_tokens = 6;
    const std::vector<double> mask6(2 * 6, 1.0);
    mode.token_mask = mask6.data();
    CHECK_NOTHROW(mha.forward(p.data(), x.view(), y.view(), mode));
}

TEST_CASE("mask_zero: a part of the network after the Embedding makes the mask from the ids it is given (a pipeline stage); "
          "without them its forward is a ValueError") {
    using Net = PadNet<true>;
    using N = Network<Net, double, Host>;
    // Layers: 0 Embedding, 1 PositionEmbedding, 2 and 3 the blocks, 4 the pooling (the mask's
    // consumer), 5 Dense. A part that starts after the Embedding and at or before the pooling reads
    // the mask; one after the pooling does not.
    CHECK_FALSE(N(0, 3).needs_token_ids());
    CHECK(N(2, 6).needs_token_ids());
    CHECK(N(4, 6).needs_token_ids());
    CHECK_FALSE(N(5, 6).needs_token_ids());
    CHECK(N::masks_tokens);
    CHECK_FALSE(Network<PadNet<false>, double, Host>::masks_tokens);
    CHECK(PadNet<true>::parameters().size() == PadNet<false>::parameters().size());  // the same variables
    const auto [p, whole] = noisy_forward_on_padded<Net>(3, 4);
    auto ids = on_place<double, Host>(kPadded, Net::input_shape::batched(4));
    for (std::size_t cut : {2u, 4u}) {  // inside the blocks; at the pooling
        CAPTURE(cut);
        N front(0, cut), back(cut, N::L);
        const double* back_params = p.data() + N::offsets[cut];  // a part takes its own variables
        const auto mid = front.forward(p.data(), ids.view(), Mode{});
        Tensor<double, Host> held(mid.shape());
        strata::copy(mid, held.view());
        // Without the ids: refused (its layers would take the padding for tokens).
        const auto msg = strata_test::error_of<strata::ValueError>([&] { back.forward(back_params, held.view(), Mode{}); });
        CHECK(msg.find("set_token_ids") != std::string::npos);
        CHECK(msg.find("none were given") != std::string::npos);
        // Ids of another batch: refused, naming both.
        back.set_token_ids(ids.view().slice(0, 3));
        const auto other = strata_test::error_of<strata::ValueError>([&] { back.forward(back_params, held.view(), Mode{}); });
        CHECK(other.find("ids of 3 examples were given for a batch of 4") != std::string::npos);
        // With them: the whole network's output, bit for bit.
        back.set_token_ids(ids.view());
        CHECK(as_double(back.forward(back_params, held.view(), Mode{})) == whole);
        // Each forward takes its own ids.
        CHECK_THROWS_AS(back.forward(back_params, held.view(), Mode{}), strata::ValueError);
    }
}

#if !defined(__CUDACC__)
TEST_CASE("mask_zero with the attention split over 2 shards (heads) and Megatron's MLP: one device's output and gradients (float64)") {
    namespace dist = strata::distribute;
    using Whole = Sequential<Input<6>, Embedding<7, 4, EmbeddingOptions{.mask_zero = true}>, PositionEmbedding<>,
                             Residual<LayerNormalization<>, MultiHeadAttention<2, 3>>,
                             Residual<LayerNormalization<>, TokenDense<8, GELU>, TokenDense<4>>, GlobalAveragePooling1D, Dense<3, Softmax>>;
    using Split = Sequential<Input<6>, Embedding<7, 4, EmbeddingOptions{.mask_zero = true}>, PositionEmbedding<>,
                             Residual<LayerNormalization<>, dist::TensorParallelMultiHeadAttention<2, 3, 0, 2>>,
                             Residual<LayerNormalization<>, dist::TensorParallelTokenDense<8, GELU, 2, dist::Columns>,
                                      dist::TensorParallelTokenDense<4, Linear, 2, dist::Rows>>,
                             GlobalAveragePooling1D, Dense<3, Softmax>>;
    static_assert(Whole::num_params == Split::num_params);
    Network<Whole, double, Host> a;
    Network<Split, double, Host> b;
    std::vector<double> p(std::size_t(Whole::num_params)), ga(p.size()), gb(p.size());
    a.init(p.data(), 12);
    const auto noise = reference_values(Whole::num_params, 13, -0.2, 0.2);
    for (std::size_t i = 0; i < p.size(); ++i) p[i] += noise[i];
    auto x = on_place<double, Host>(kPadded, Whole::input_shape::batched(4));
    const auto ya = as_double(a.forward(p.data(), x.view(), Mode{.training = true}));
    const auto yb = as_double(b.forward(p.data(), x.view(), Mode{.training = true}));
    for (std::size_t i = 0; i < ya.size(); ++i) CHECK(yb[i] == doctest::Approx(ya[i]).epsilon(1e-12));
    const auto w = reference_values(12, 14);
    std::copy(w.begin(), w.end(), a.output_grad().data());
    std::copy(w.begin(), w.end(), b.output_grad().data());
    a.backward(p.data(), ga.data(), Mode{.training = true});
    b.backward(p.data(), gb.data(), Mode{.training = true});
    double worst = 0;
    for (std::size_t i = 0; i < ga.size(); ++i) worst = std::max(worst, std::abs(ga[i] - gb[i]));
    INFO("largest gradient difference " << worst);
    CHECK(worst < 1e-12);
    for (std::size_t i = 0; i < 4; ++i) CHECK(gb[i] == 0.0);  // the padding's row
}

namespace {
// Sequences of 1 to 6 ids in [1, 6], padded with 0; the label: whether id 1 is among them.
strata::data::Dataset<> has_one_task(std::size_t n, std::uint64_t seed) {
    const auto u = strata_test::lcg(n * 7, seed, 0, 1);
    std::vector<float> x(n * 6, 0.0f);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        const auto len = 1 + std::size_t(u[i * 7] * 6) % 6;
        bool one = false;
        for (std::size_t t = 0; t < len; ++t) {
            x[i * 6 + t] = float(1 + std::int64_t(u[i * 7 + 1 + t] * 6) % 6);
            one = one || x[i * 6 + t] == 1.0f;
        }
        y[i] = one ? 1 : 0;
    }
    return strata::data::Dataset<>::from_arrays(std::move(x), {6}, std::move(y));
}
}  // namespace

TEST_CASE("mask_zero under Mirrored (2 replicas, shards of different padding) trains as one device does") {
    using Net = PadNet<true>;
    const auto opt = strata::optim::SGD{.learning_rate = 0.1};
    strata::Model<Net> one(3);
    one.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    one.fit(has_one_task(96, 5).batch(12), {.epochs = 2, .verbose = 0});
    strata::distribute::Mirrored<> two(2);
    strata::Model<Net, strata::distribute::Mirrored<>> m(two, 3);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    m.fit(has_one_task(96, 5).batch(12), {.epochs = 2, .verbose = 0});
    const auto a = one.get_weights(), b = m.get_weights();
    REQUIRE(a.size() == b.size());
    double diff = 0;
    for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, double(std::abs(a[i] - b[i])));
    INFO("largest weight difference " << diff);
    CHECK(diff < 1e-5);  // float32 rounding of the summed gradients
    for (std::size_t d = 0; d < 4; ++d) CHECK(a[d] == b[d]);  // the padding's row: never trained, the initial values
    const auto ea = one.evaluate(has_one_task(64, 6).batch(16)), eb = m.evaluate(has_one_task(64, 6).batch(16));
    CHECK(ea.loss == doctest::Approx(eb.loss).epsilon(1e-5));
}

// ---- Padding with a per-token output: the loss and accuracy over the tokens that count --------

namespace {
// The causal next-token model of above, with id 0 as padding (or not).
template <bool Mask>
using PaddedLm = Sequential<Input<kTokens>, Embedding<kVocab, 16, EmbeddingOptions{.mask_zero = Mask}>, PositionEmbedding<>,
                            Residual<LayerNormalization<>, MultiHeadAttention<2, 8, 0, MultiHeadAttentionOptions{.causal = true}>>,
                            Residual<LayerNormalization<>, TokenDense<32, GELU>, TokenDense<16>>, LayerNormalization<>,
                            TokenDense<kVocab, Softmax>>;

// n sequences of 1 to kTokens real ids counting through 1..kVocab-1 from a random start, padded
// with 0 at the end; the target at each real position is the next id (the last one's: the id
// after it), at each padded position `pad_target` (a random id when negative). `alternate`: the
// even examples get 1 or 2 real tokens and the odd ones 7 or 8 (replicas' shards then count
// different numbers of tokens).
strata::data::Dataset<> padded_counting(std::size_t n, std::uint64_t seed, int pad_target, bool alternate = false) {
    const auto u = strata_test::lcg(n * (kTokens + 2), seed, 0, 1);
    const auto junk = strata_test::lcg(n * kTokens, 977, 0, 1);
    std::vector<float> x(n * kTokens, 0.0f);
    std::vector<std::int32_t> y(n * kTokens);
    const std::int64_t words = kVocab - 1;
    for (std::size_t i = 0; i < n; ++i) {
        const double r = u[i * (kTokens + 2)];
        const std::size_t len = alternate ? (i % 2 == 0 ? 1 + std::size_t(r * 2) % 2 : 7 + std::size_t(r * 2) % 2)
                                          : 1 + std::size_t(r * kTokens) % kTokens;
        std::int64_t id = 1 + std::int64_t(u[i * (kTokens + 2) + 1] * double(words)) % words;
        for (std::size_t t = 0; t < kTokens; ++t) {
            if (t < len) {
                x[i * kTokens + t] = float(id);
                id = id % words + 1;
                y[i * kTokens + t] = std::int32_t(id);
            } else {
                y[i * kTokens + t] = pad_target >= 0 ? pad_target : std::int32_t(junk[i * kTokens + t] * double(kVocab)) % std::int32_t(kVocab);
            }
        }
    }
    return strata::data::Dataset<>::from_arrays(std::move(x), {std::size_t(kTokens)}, std::move(y), kTokens);
}
template <bool Mask>
std::vector<float> weights_after(int pad_target, std::uint64_t seed = 3) {
    strata::Model<PaddedLm<Mask>> m(seed);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    m.fit(padded_counting(64, 5, pad_target).batch(16), {.epochs = 2, .verbose = 0});
    return m.get_weights();
}
}  // namespace

TEST_CASE("mask_zero with a per-token output: the padded positions' targets change nothing; without the mask they do") {
    static_assert(strata::Model<PaddedLm<true>>::masked_output && !strata::Model<PaddedLm<false>>::masked_output);
    CHECK(weights_after<true>(0) == weights_after<true>(-1));   // bit for bit: the padded tokens' losses are not even computed
    CHECK(weights_after<false>(0) != weights_after<false>(-1));  // the negative control
}

TEST_CASE("mask_zero with a per-token output: evaluate's loss and accuracy are the means over the tokens that count") {
    strata::Model<PaddedLm<true>> m(7);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    m.fit(padded_counting(64, 8, -1).batch(16), {.epochs = 2, .verbose = 0});
    const auto data = padded_counting(24, 9, -1);
    const auto e = m.evaluate(data.batch(24));  // one batch: its means
    const auto p = m.predict(data.batch(24));    // [24, kTokens, kVocab]
    double loss = 0, right = 0, counted = 0;
    std::int64_t i = 0;
    for (auto it = data.batch(24).iterate(0); it != std::default_sentinel; ++it) {
        const auto& b = *it;
        for (std::size_t ex = 0; ex < b.size(); ++ex, ++i)
            for (std::int64_t t = 0; t < kTokens; ++t) {
                if (b.x_at(ex)[std::size_t(t)] == 0.0f) continue;
                const float* row = p.data() + (i * kTokens + t) * kVocab;
                const auto want = b.y_at(ex)[std::size_t(t)];
                loss -= std::log(double(row[want]));
                right += std::max_element(row, row + kVocab) - row == want ? 1 : 0;
                counted += 1;
            }
    }
    CHECK(counted > 24);
    CHECK(counted < 24 * kTokens);
    CHECK(e.loss == doctest::Approx(loss / counted).epsilon(1e-5));
    CHECK(e.accuracy == doctest::Approx(right / counted).epsilon(1e-6));
}

namespace {
// padded_counting's alternating examples reordered: the n/2 long ones (7 or 8 tokens that count)
// first, then the n/2 short ones (1 or 2). Batched by n/2, the two batches count very different
// numbers of tokens.
strata::data::Dataset<> long_then_short(std::size_t n, std::uint64_t seed) {
    const auto plain = padded_counting(n, seed, -1, true);
    std::vector<float> x;
    std::vector<std::int32_t> y;
    for (const std::size_t parity : {1u, 0u})
        for (auto it = plain.batch(n).iterate(0); it != std::default_sentinel; ++it)
            for (std::size_t ex = parity; ex < it->size(); ex += 2) {
                x.insert(x.end(), it->x_at(ex).begin(), it->x_at(ex).end());
                y.insert(y.end(), it->y_at(ex).begin(), it->y_at(ex).end());
            }
    return strata::data::Dataset<>::from_arrays(std::move(x), {std::size_t(kTokens)}, std::move(y), kTokens);
}
// Each batch's tokens that count, and those of them `p` ([examples, kTokens, kVocab], in the
// data's order) predicts right.
struct TokenTally {
    std::vector<double> right, counted, in_top2;  // in_top2: ids among the 2 highest (tf.math.in_top_k)
    double token_mean() const {
        double r = 0, c = 0;
        for (std::size_t b = 0; b < right.size(); ++b) r += right[b], c += counted[b];
        return r / c;
    }
};
TokenTally tally(const strata::data::Dataset<>& batched, const Tensor<float, strata::place::Host>& p) {
    TokenTally t;
    std::int64_t i = 0;
    for (auto it = batched.iterate(0); it != std::default_sentinel; ++it) {
        const auto& b = *it;
        t.right.push_back(0), t.counted.push_back(0), t.in_top2.push_back(0);
        for (std::size_t ex = 0; ex < b.size(); ++ex, ++i)
            for (std::int64_t k = 0; k < kTokens; ++k) {
                if (b.x_at(ex)[std::size_t(k)] == 0.0f) continue;
                const float* row = p.data() + (i * kTokens + k) * kVocab;
                const auto want = b.y_at(ex)[std::size_t(k)];
                t.right.back() += std::max_element(row, row + kVocab) - row == want ? 1 : 0;
                t.in_top2.back() += std::count_if(row, row + kVocab, [&](float v) { return v > row[want]; }) < 2 ? 1 : 0;
                t.counted.back() += 1;
            }
    }
    return t;
}
// Sets stop_training after the first batch (a clean stop: BackupAndRestore backs up there).
struct StopAfterFirstBatch : strata::train::Callback {
    void on_train_batch_end(strata::train::TrainingContext& ctx, std::int64_t, const strata::train::Logs&) override {
        ctx.stop_training = true;
    }
};
}  // namespace

TEST_CASE("mask_zero with a per-token output: over batches of different padding, an epoch's and evaluate's accuracy are "
          "Σ right / Σ tokens that count (Keras' masked metric), and a resumed epoch keeps the count") {
    strata::Model<PaddedLm<true>> m(7);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    m.fit(padded_counting(64, 8, -1).batch(16), {.epochs = 2, .verbose = 0});
    const auto data = long_then_short(24, 9).batch(12);
    const auto t = tally(data, m.predict(data));
    REQUIRE(t.counted.size() == 2);
    CHECK(t.counted[0] > 12 * 6);
    CHECK(t.counted[1] < 12 * 3);
    // What an example-weighted mean of the batches' accuracies would give (the negative control):
    // the data must tell the two apart, or the checks below would prove nothing.
    const double batch_mean = (t.right[0] / t.counted[0] + t.right[1] / t.counted[1]) / 2;
    INFO("tokens that count: " << t.counted[0] << " and " << t.counted[1] << "; token mean " << t.token_mean()
                               << ", mean of the batches " << batch_mean);
    REQUIRE(std::abs(t.token_mean() - batch_mean) > 0.02);
    CHECK(m.evaluate(data).accuracy == doctest::Approx(t.token_mean()).epsilon(1e-9));
    // The top-2 accuracy counts the same tokens (Keras' masked sparse_top_k_categorical_accuracy).
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.0},
              {"accuracy", strata::metrics::sparse_top_k_categorical_accuracy(2)});
    const double top2 = (t.in_top2[0] + t.in_top2[1]) / (t.counted[0] + t.counted[1]);
    INFO("top-2 over the tokens that count " << top2 << "; over every token the padded ones' random ids would enter");
    CHECK(top2 > t.token_mean());
    CHECK(top2 < 1.0);
    CHECK(m.evaluate(data).metrics.at("sparse_top_k_categorical_accuracy") == doctest::Approx(top2).epsilon(1e-12));
    // An epoch of fit, with a learning rate of 0 (the weights the predictions came from): its
    // accuracy and top-2 accuracy, and each step's accuracy.
    const auto h = m.fit(data, {.epochs = 1, .verbose = 0});
    CHECK(h["accuracy"][0] == doctest::Approx(t.token_mean()).epsilon(1e-9));
    CHECK(h["sparse_top_k_categorical_accuracy"][0] == doctest::Approx(top2).epsilon(1e-12));
    auto it = data.iterate(0);
    CHECK(m.train_step(*it).accuracy == doctest::Approx(t.right[0] / t.counted[0]).epsilon(1e-9));
    ++it;
    CHECK(m.train_step(*it).accuracy == doctest::Approx(t.right[1] / t.counted[1]).epsilon(1e-9));
    // Stopped after the first batch and resumed: the backup holds the tokens counted so far, and
    // the resumed epoch reports the uninterrupted one's accuracy.
    strata_test::TempDir dir("strata_embedding_backup");
    auto backup = std::make_shared<strata::train::BackupAndRestore>(dir.path);
    m.fit(data, {.epochs = 1, .callbacks = {backup, std::make_shared<StopAfterFirstBatch>()}, .verbose = 0});
    const auto pos = strata::train::BackupAndRestore::read_position(backup->file());
    CHECK(pos.batches == 1);
    CHECK(pos.seen == 12);
    CHECK(pos.counted == t.counted[0]);
    CHECK(pos.correct == t.right[0]);
    const auto resumed = m.fit(data, {.epochs = 1, .callbacks = {backup}, .verbose = 0});
    REQUIRE(backup->restored());
    CHECK(resumed["accuracy"][0] == h["accuracy"][0]);
}

TEST_CASE("mask_zero with a per-token output learns to count through padded sequences; the refusals") {
    strata::Model<PaddedLm<true>> m(11);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    m.fit(padded_counting(512, 12, 0).shuffle(512, 13).batch(32), {.epochs = 8, .verbose = 0});
    const auto e = m.evaluate(padded_counting(256, 14, -1).batch(64));
    MESSAGE("held-out accuracy over the tokens that count: " << e.accuracy);
    CHECK(e.accuracy > 0.95);
    // A custom loss sees whole examples and takes no mask (the built-in losses do: below).
    strata::Model<PaddedLm<true>> other(1);
    const strata::loss::Custom custom{.name = "mine", .loss = [](auto, auto) { return 0.0; }, .gradient = [](auto, auto, auto) {}};
    CHECK_THROWS_WITH_AS(other.compile(custom), doctest::Contains("loss::Custom 'mine' sees whole examples and takes no mask"),
                         strata::ValueError);
    // Class weights need one class id per example.
    other.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    CHECK_THROWS_WITH_AS(other.fit(padded_counting(8, 2, 0).batch(4), {.epochs = 1, .verbose = 0, .class_weight = {{1, 2.0}}}),
                         doctest::Contains("class weights need one class id per example"), strata::ValueError);
}

namespace {
// padded_counting's examples, each weighed by 0.25, 1 or 3 in turn.
strata::data::Dataset<> weighted_counting(std::size_t n, std::uint64_t seed) {
    const auto plain = padded_counting(n, seed, -1, true);
    std::vector<float> x, w;
    std::vector<std::int32_t> y;
    for (auto it = plain.batch(n).iterate(0); it != std::default_sentinel; ++it) {
        const auto& b = *it;
        x.assign(b.x.begin(), b.x.end());
        y.assign(b.y.begin(), b.y.end());
    }
    for (std::size_t i = 0; i < n; ++i) w.push_back(i % 3 == 0 ? 0.25f : i % 3 == 1 ? 1.0f : 3.0f);
    return strata::data::Dataset<>::from_arrays(std::move(x), {std::size_t(kTokens)}, std::move(y), kTokens, std::move(w));
}
// PaddedLm trained 2 epochs by SGD on `data` (batches of 12) on one device and on two Mirrored
// replicas from the same seed: the one device's weights, the largest difference of the two's, and
// their last epoch's loss and accuracy.
struct OneAndMirrored {
    std::vector<float> weights;
    double diff = 0, loss_one = 0, loss_two = 0, accuracy_one = 0, accuracy_two = 0;
};
OneAndMirrored one_and_mirrored(const strata::data::Dataset<>& data) {
    const auto opt = strata::optim::SGD{.learning_rate = 0.1};
    strata::Model<PaddedLm<true>> one(3);
    one.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    const auto h1 = one.fit(data.batch(12), {.epochs = 2, .verbose = 0});
    strata::distribute::Mirrored<> two(2);
    strata::Model<PaddedLm<true>, strata::distribute::Mirrored<>> m(two, 3);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    const auto h2 = m.fit(data.batch(12), {.epochs = 2, .verbose = 0});
    OneAndMirrored r{one.get_weights()};
    const auto b = m.get_weights();
    REQUIRE(r.weights.size() == b.size());
    for (std::size_t i = 0; i < b.size(); ++i) r.diff = std::max(r.diff, double(std::abs(r.weights[i] - b[i])));
    r.loss_one = h1["loss"].back(), r.loss_two = h2["loss"].back();
    r.accuracy_one = h1["accuracy"].back(), r.accuracy_two = h2["accuracy"].back();
    return r;
}
}  // namespace

TEST_CASE("mask_zero with a per-token output and sample weights: Σ over the real tokens of loss × weight / their count (Keras 3)") {
    strata::Model<PaddedLm<true>> m(5);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    m.fit(padded_counting(64, 8, -1).batch(16), {.epochs = 1, .verbose = 0});
    const auto data = weighted_counting(24, 9);
    const auto e = m.evaluate(data.batch(24));  // one batch: its sums
    const auto p = m.predict(data.batch(24));
    double weighted = 0, plain = 0, counted = 0, right = 0;
    for (auto it = data.batch(24).iterate(0); it != std::default_sentinel; ++it) {
        const auto& b = *it;
        REQUIRE(b.w.size() == 24);
        for (std::size_t ex = 0; ex < b.size(); ++ex)
            for (std::int64_t t = 0; t < kTokens; ++t) {
                if (b.x_at(ex)[std::size_t(t)] == 0.0f) continue;
                const float* row = p.data() + (std::int64_t(ex) * kTokens + t) * kVocab;
                const auto want = b.y_at(ex)[std::size_t(t)];
                weighted -= double(b.w[ex]) * std::log(double(row[want]));
                plain -= std::log(double(row[want]));
                right += std::max_element(row, row + kVocab) - row == want ? 1 : 0;
                counted += 1;
            }
    }
    // The divisor is the real tokens' count, not the sum of their weights (Keras 3's apply_mask).
    CHECK(e.loss == doctest::Approx(weighted / counted).epsilon(1e-5));
    CHECK(std::abs(e.loss - plain / counted) > 1e-3 * std::abs(plain / counted));  // the weights count
    CHECK(e.accuracy == doctest::Approx(right / counted).epsilon(1e-6));           // the accuracy is not weighted
    // Training on it: two replicas on shards of different padding and weights end where one device does.
    const auto w = one_and_mirrored(weighted_counting(96, 16));
    INFO("largest weight difference " << w.diff);
    CHECK(w.diff < 1e-5);
    CHECK(w.loss_one == doctest::Approx(w.loss_two).epsilon(1e-5));
    // The weights move the training (the negative control: the same data unweighted).
    CHECK(one_and_mirrored(padded_counting(96, 16, -1, true)).weights != w.weights);
}

TEST_CASE("mask_zero with a per-token output under Mirrored (shards counting 1-2 and 7-8 tokens) trains as one device does") {
    const auto r = one_and_mirrored(padded_counting(96, 16, -1, true));
    INFO("largest weight difference " << r.diff);
    // Each replica's shard alone would weigh its tokens by its own count (1-2 against 7-8 per
    // example): the global batch's count, summed over the replicas, is what makes them equal.
    CHECK(r.diff < 1e-5);
    CHECK(r.loss_one == doctest::Approx(r.loss_two).epsilon(1e-5));
    CHECK(r.accuracy_one == doctest::Approx(r.accuracy_two).epsilon(1e-5));
}

namespace {
// padded_counting(n, seed, 0)'s targets as one-hot rows ([n, kTokens, kVocab]); `nan_padding`:
// the padded positions' rows NaN instead (a loss or a metric that read one would be NaN).
strata::data::Dataset<float> one_hot_counting(std::size_t n, std::uint64_t seed, bool nan_padding) {
    const auto plain = padded_counting(n, seed, 0);
    std::vector<float> x, y;
    for (auto it = plain.batch(n).iterate(0); it != std::default_sentinel; ++it) {
        const auto& b = *it;
        x.assign(b.x.begin(), b.x.end());
        for (std::size_t ex = 0; ex < b.size(); ++ex)
            for (std::size_t t = 0; t < std::size_t(kTokens); ++t)
                for (std::int32_t c = 0; c < std::int32_t(kVocab); ++c) {
                    const bool pad = b.x_at(ex)[t] == 0.0f;
                    y.push_back(pad && nan_padding ? std::nanf("") : (b.y_at(ex)[t] == c ? 1.0f : 0.0f));
                }
    }
    return strata::data::Dataset<float>::from_arrays(std::move(x), {std::size_t(kTokens)}, std::move(y), kTokens * kVocab);
}
template <class Y>
std::tuple<std::vector<float>, strata::train::History, strata::Evaluation> lm_trained(const strata::loss::Loss& loss,
                                                                                       const strata::data::Dataset<Y>& data) {
    strata::Model<PaddedLm<true>> m(3);
    m.compile(loss, strata::optim::Adam{.learning_rate = 0.01});
    auto h = m.fit(data.batch(16), {.epochs = 2, .verbose = 0});
    return {m.get_weights(), std::move(h), m.evaluate(data.batch(16))};
}
}  // namespace

TEST_CASE("mask_zero with a per-token output and CategoricalCrossentropy: one-hot rows train bit for bit as their ids do "
          "under SparseCategoricalCrossentropy, and the padded rows are never read") {
    const auto [ws, hs, es] = lm_trained(strata::loss::SparseCategoricalCrossentropy{}, padded_counting(64, 8, 0));
    const auto [wc, hc, ec] = lm_trained(strata::loss::CategoricalCrossentropy{}, one_hot_counting(64, 8, false));
    const auto [wn, hn, en] = lm_trained(strata::loss::CategoricalCrossentropy{}, one_hot_counting(64, 8, true));
    CHECK(wc == ws);  // the same sums in the same order: one-hot rows are their ids
    CHECK(wn == ws);  // NaN rows at the padding: not read
    for (const char* key : {"loss", "accuracy"})
        for (std::size_t e = 0; e < 2; ++e) {
            CHECK(hc[key][e] == hs[key][e]);
            CHECK(hn[key][e] == hs[key][e]);
        }
    CHECK(ec.loss == es.loss);
    CHECK(en.accuracy == es.accuracy);
    CHECK(std::isfinite(en.loss));
}

namespace {
// A per-token binary tagger: is each real token's id odd? Output [kTokens, 1].
template <bool Mask>
using PaddedTagger = Sequential<Input<kTokens>, Embedding<kVocab, 16, EmbeddingOptions{.mask_zero = Mask}>, PositionEmbedding<>,
                                Residual<LayerNormalization<>, MultiHeadAttention<2, 8>>, LayerNormalization<>,
                                TokenDense<1, Sigmoid>>;
// n sequences of 1..kTokens random ids in 1..kVocab-1 (alternate: 1-2 and 7-8 of them), padded
// with 0; the target 1 for an odd id, and at the padding `pad_target` (random 0 or 1 when negative).
strata::data::Dataset<float> odd_tags(std::size_t n, std::uint64_t seed, int pad_target, bool alternate = false) {
    const auto u = strata_test::lcg(n * (kTokens + 1), seed, 0, 1);
    const auto junk = strata_test::lcg(n * kTokens, 979, 0, 1);
    std::vector<float> x(n * kTokens, 0.0f), y(n * kTokens);
    for (std::size_t i = 0; i < n; ++i) {
        const double r = u[i * (kTokens + 1)];
        const std::size_t len = alternate ? (i % 2 == 0 ? 1 + std::size_t(r * 2) % 2 : 7 + std::size_t(r * 2) % 2)
                                          : 1 + std::size_t(r * kTokens) % kTokens;
        for (std::size_t t = 0; t < std::size_t(kTokens); ++t) {
            const std::size_t k = i * kTokens + t;
            if (t < len) {
                x[k] = float(1 + std::int64_t(u[k + i + 1] * double(kVocab - 1)) % (kVocab - 1));
                y[k] = std::int64_t(x[k]) % 2 == 1 ? 1.0f : 0.0f;
            } else {
                y[k] = pad_target >= 0 ? float(pad_target) : (junk[k] < 0.5 ? 0.0f : 1.0f);
            }
        }
    }
    return strata::data::Dataset<float>::from_arrays(std::move(x), {std::size_t(kTokens)}, std::move(y), kTokens);
}
template <bool Mask>
std::vector<float> tagger_weights(int pad_target) {
    strata::Model<PaddedTagger<Mask>> m(3);
    m.compile(strata::loss::MeanSquaredError{}, strata::optim::Adam{.learning_rate = 0.01}, {"accuracy", "precision", "recall"});
    m.fit(odd_tags(64, 5, pad_target).batch(16), {.epochs = 2, .verbose = 0});
    return m.get_weights();
}
}  // namespace

TEST_CASE("mask_zero with a per-token binary output: MeanSquaredError, the binary accuracy, precision and recall over the "
          "tokens that count, against predict; Mirrored equals one device; the padding's targets change nothing") {
    static_assert(strata::Model<PaddedTagger<true>>::masked_output && strata::Model<PaddedTagger<true>>::sequence_tokens == kTokens);
    CHECK(tagger_weights<true>(0) == tagger_weights<true>(-1));   // bit for bit: never read
    CHECK(tagger_weights<false>(0) != tagger_weights<false>(-1));  // the negative control
    const std::vector<strata::metrics::Metric> metrics{"accuracy", "precision", "recall"};
    strata::Model<PaddedTagger<true>> m(7);
    m.compile(strata::loss::MeanSquaredError{}, strata::optim::Adam{.learning_rate = 0.01}, metrics);
    const auto h = m.fit(odd_tags(256, 8, -1).shuffle(256, 2).batch(16), {.epochs = 6, .verbose = 0});
    MESSAGE("the tagger's last epoch: accuracy " << h["accuracy"].back() << ", precision " << h["precision"].back()
                                                 << ", recall " << h["recall"].back());
    CHECK(h["accuracy"].back() > 0.95);
    // evaluate over two batches of very different padding against predict's outputs, early in
    // training (so that the accuracy, precision and recall are not all 1).
    strata::Model<PaddedTagger<true>> early(7);
    early.compile(strata::loss::MeanSquaredError{}, strata::optim::Adam{.learning_rate = 0.003}, metrics);
    early.fit(odd_tags(32, 8, -1).batch(16), {.epochs = 1, .verbose = 0});
    const auto data = odd_tags(24, 9, -1, true).batch(12);
    const auto e = early.evaluate(data);
    const auto p = early.predict(data);  // [24, kTokens, 1]
    double sq = 0, right = 0, counted = 0, tp = 0, fp = 0, fn = 0, sq_batches = 0;
    std::int64_t i = 0;
    for (auto it = data.iterate(0); it != std::default_sentinel; ++it) {
        const auto& b = *it;
        double batch_sq = 0, batch_counted = 0;
        for (std::size_t ex = 0; ex < b.size(); ++ex, ++i)
            for (std::int64_t t = 0; t < kTokens; ++t) {
                if (b.x_at(ex)[std::size_t(t)] == 0.0f) continue;
                const double out = p.data()[i * kTokens + t], want = b.y_at(ex)[std::size_t(t)];
                batch_sq += (out - want) * (out - want);
                batch_counted += 1;
                right += (out > 0.5) == (want > 0.5) ? 1 : 0;
                tp += out > 0.5 && want > 0.5, fp += out > 0.5 && want <= 0.5, fn += out <= 0.5 && want > 0.5;
            }
        sq += batch_sq, counted += batch_counted;
        sq_batches += batch_sq / batch_counted * double(b.size());  // each batch's masked mean, weighted by its examples
    }
    INFO("by hand: accuracy " << right / counted << ", precision " << tp / (tp + fp) << ", recall " << tp / (tp + fn));
    REQUIRE(tp > 0);
    REQUIRE(right < counted);
    REQUIRE(fp + fn > 0);
    CHECK(e.loss == doctest::Approx(sq_batches / 24).epsilon(1e-5));
    CHECK(e.accuracy == doctest::Approx(right / counted).epsilon(1e-9));
    CHECK(e.metrics.at("precision") == doctest::Approx(tp / (tp + fp)).epsilon(1e-12));
    CHECK(e.metrics.at("recall") == doctest::Approx(tp / (tp + fn)).epsilon(1e-12));
    // Two replicas on shards counting 1-2 and 7-8 tokens end where one device does.
    const auto opt = strata::optim::SGD{.learning_rate = 0.1};
    strata::Model<PaddedTagger<true>> one(3);
    one.compile(strata::loss::MeanSquaredError{}, opt, metrics);
    const auto initial = one.get_weights();
    const auto h1 = one.fit(odd_tags(96, 16, -1, true).batch(12), {.epochs = 2, .verbose = 0});
    strata::distribute::Mirrored<> two(2);
    strata::Model<PaddedTagger<true>, strata::distribute::Mirrored<>> mirrored(two, 3);
    mirrored.compile(strata::loss::MeanSquaredError{}, opt, metrics);
    const auto h2 = mirrored.fit(odd_tags(96, 16, -1, true).batch(12), {.epochs = 2, .verbose = 0});
    const auto a = one.get_weights(), b = mirrored.get_weights();
    double diff = 0;
    for (std::size_t k = 0; k < a.size(); ++k) diff = std::max(diff, double(std::abs(a[k] - b[k])));
    INFO("largest weight difference " << diff);
    CHECK(diff < 1e-5);
    CHECK(a != initial);  // it trained
    for (const char* key : {"loss", "accuracy", "precision", "recall"}) CHECK(h2[key].back() == doctest::Approx(h1[key].back()).epsilon(1e-5));
}

namespace {
// `Net` trained 2 epochs by Adam from seed 3 on `data` (batches of 12) under `s`, in float64: its
// weights, History and evaluation of the same batches.
struct Trained {
    std::vector<double> weights;
    strata::train::History history;
    strata::Evaluation evaluation;
};
template <class Net, class Strategy>
Trained train_f64(Strategy& s, const strata::data::Dataset<>& data) {
    strata::Model<Net, Strategy, double> m(s, 3);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    auto h = m.fit(data.batch(12), {.epochs = 2, .verbose = 0});
    return {m.get_weights(), std::move(h), m.evaluate(data.batch(12))};
}
template <class Net, class Split>
void check_pipeline_equals_one_device(const strata::data::Dataset<>& data) {
    namespace dist = strata::distribute;
    dist::OneDevice<> one;
    const auto r1 = train_f64<Net>(one, data);
    for (int replicas : {1, 2}) {
        CAPTURE(replicas);
        using S = dist::Pipeline<Host, dist::OneFOneB, Split>;
        S pipeline({.micro_batches = 3, .replicas = replicas});
        const auto r = train_f64<Net>(pipeline, data);
        CHECK(strata_test::max_relative_difference(r.weights, r1.weights) <= 1e-12);
        for (const char* key : {"loss", "accuracy"})
            for (std::size_t e = 0; e < 2; ++e) CHECK(r.history[key][e] == doctest::Approx(r1.history[key][e]).epsilon(1e-12));
        CHECK(r.evaluation.loss == doctest::Approx(r1.evaluation.loss).epsilon(1e-12));
        CHECK(r.evaluation.accuracy == doctest::Approx(r1.evaluation.accuracy).epsilon(1e-12));
    }
}
}  // namespace

TEST_CASE("mask_zero under a Pipeline: stages after the Embedding make the mask from the ids; a per-token output (with "
          "and without sample weights) and a pooled classifier equal one device (float64, 1 and 2 replicas)") {
    namespace split = strata::distribute::split;
    // The language model in three stages (the Embedding and position; the attention block; the
    // MLP block and the output): micro-batches of 2 examples whose padding differs, the loss over
    // the global batch's tokens that count.
    check_pipeline_equals_one_device<PaddedLm<true>, split::At<2, 3>>(padded_counting(46, 16, -1, true));
    check_pipeline_equals_one_device<PaddedLm<true>, split::At<2, 3>>(weighted_counting(46, 16));
    // The pooled classifier (with dropout), cut inside the blocks and at the pooling.
    check_pipeline_equals_one_device<PadNet<true>, split::At<3>>(has_one_task(46, 5));
    check_pipeline_equals_one_device<PadNet<true>, split::At<4>>(has_one_task(46, 5));
}
#endif

TEST_CASE_TEMPLATE("mask_zero on every place: the output and gradients match the host's float64, and padding reaches nothing", P,
                   STRATA_TEST_PLACES) {
    const auto [ref, gref] = pad_pass<true>(0.3);
    const auto [y, g] = pad_pass<true, float, P>(0.3);
    const auto [y2, g2] = pad_pass<true, float, P>(-2.0);
    REQUIRE(y.size() == ref.size());
    for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(ref[i]).epsilon(1e-5));
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(gref[i]).epsilon(1e-3).scale(1e-4));
    CHECK(y == y2);
    for (std::size_t i = 0; i < 4; ++i) CHECK(g2[i] == 0.0);
}
