// ParameterServer: sharded variables, the six sync modes and their schedules, the two clocks,
// and the errors. Equalities are against OneDevice (the oracle) or between modes that the
// definitions make equal; schedules are checked through the counts the path records.
#include <doctest/doctest.h>

#include "padded_sequences.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>

#include <csignal>
#include <memory>
#include <signal.h>
#include <unistd.h>

using namespace strata::nn;
namespace dist = strata::distribute;
namespace ss = strata::sync;
using strata::place::Host;
using strata_test::error_of;
using strata_test::has;
using strata_test::lcg;
using strata_test::max_relative_difference;

namespace {

using Cnn = Sequential<Input<6, 6, 2>, Conv2D<3, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<5, Tanh>, Dense<3, Softmax>>;
using Mlp = Sequential<Input<5>, Dense<7, Tanh>, Dense<3, Softmax>>;

template <class Net>
strata::data::Dataset<> dataset(std::size_t n, std::uint64_t seed) {
    constexpr std::size_t d = std::size_t(Net::input_shape::size);
    auto f = lcg(n * d, seed, 0, 1);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((f[i * d] + f[i * d + d - 1] > 1.0) + (f[i * d + 1] > 0.5));
    std::vector<std::size_t> shape(Net::input_shape::dims.begin(), Net::input_shape::dims.end());
    return strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), shape, std::move(y));
}


template <class Net, class T = float, class Strategy>
std::vector<T> train(Strategy& s, const strata::data::Dataset<>& ds, strata::optim::Optimizer opt, int epochs = 2) {
    strata::Model<Net, Strategy, T> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(ds, {.epochs = epochs, .verbose = 0});
    return model.get_weights();
}

template <class Net, class T = float>
std::vector<T> one_device(const strata::data::Dataset<>& ds, strata::optim::Optimizer opt, int epochs = 2) {
    dist::OneDevice<> one;
    return train<Net, T>(one, ds, opt, epochs);
}

template <class Sync, class Net = Mlp, class T = float>
std::vector<T> ps_train(int workers, int servers, dist::ParameterServerOptions o, const strata::data::Dataset<>& ds,
                        strata::optim::Optimizer opt, int epochs = 2, dist::ParameterServerStats* stats = nullptr) {
    dist::ParameterServer<Host, Sync> ps(workers, servers, o);
    strata::Model<Net, decltype(ps), T> model(ps, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(ds, {.epochs = epochs, .verbose = 0});
    if (stats) *stats = model.gradient_path().stats();
    return model.get_weights();
}

template <class T>
void check_synchronous_equals_one_device(strata::optim::Optimizer opt, double tolerance) {
    const int workers = 3;
    // 55 examples: with mini-batches of 4 the last round has 4 + 3 examples (two workers); with
    // mini-batches of 3 it has one example, on one worker.
    for (std::size_t b : {4u, 3u}) {
        const auto data = dataset<Cnn>(55, 3);
        const auto reference = one_device<Cnn, T>(data.batch(b * workers), opt);
        for (int servers = 1; servers <= 3; ++servers)
            for (const dist::Partitioner& part : {dist::Partitioner{}, dist::Partitioner{dist::FixedShards{2}},
                                                  dist::Partitioner{dist::MaxSize{.max_shard_bytes = 64}}}) {
                CAPTURE(b);
                CAPTURE(servers);
                CAPTURE(dist::describe(part));
                const auto w = ps_train<ss::Synchronous, Cnn, T>(workers, servers, {.partitioner = part}, data.batch(b), opt);
                CHECK(max_relative_difference(w, reference) <= tolerance);
            }
    }
}

}  // namespace

TEST_CASE("ParameterServer Synchronous equals OneDevice on the same global batches (float64, Adam), S = 1, 2, 3") {
    check_synchronous_equals_one_device<double>(strata::optim::Adam{.learning_rate = 0.01}, 1e-12);
}

TEST_CASE("ParameterServer Synchronous equals OneDevice on the same global batches (float32, SGD momentum), S = 1, 2, 3") {
    check_synchronous_equals_one_device<float>(strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9}, 1e-6);
}

TEST_CASE("global_clipnorm: the servers clip by the whole model's norm, as one device does (float64, S = 1, 2, 3)") {
    // A clip norm every step's gradient exceeds: without the whole norm (each server clipping by
    // its own part's) the servers would each scale by another factor.
    const strata::optim::Optimizer clipped = strata::optim::Adam{.learning_rate = 0.01, .global_clipnorm = 0.05};
    check_synchronous_equals_one_device<double>(clipped, 1e-12);
    // The negative control: the clip changes the result by far more than the tolerance.
    const auto data = dataset<Cnn>(55, 3);
    const auto plain = one_device<Cnn, double>(data.batch(12), strata::optim::Adam{.learning_rate = 0.01});
    const auto clip = one_device<Cnn, double>(data.batch(12), clipped);
    CHECK(max_relative_difference(plain, clip) > 1e-3);
    // And asynchronous training clips each update's gradient by its own whole norm: one worker
    // is sequential SGD, so it equals one device on the same mini-batches.
    const auto one_worker = ps_train<ss::Asynchronous<>, Cnn, double>(1, 3, {}, data.batch(12), clipped);
    CHECK(max_relative_difference(one_worker, clip) <= 1e-12);
}

namespace {
// The padded language model of padded_sequences.hpp (mini-batches count different numbers of
// tokens).
using strata_test::MaskedLm;
using strata_test::padded_sequences;
template <class Strategy>
std::pair<std::vector<double>, strata::train::History> fit_masked(Strategy& s, const strata::data::Dataset<>& batched) {
    strata::Model<MaskedLm, Strategy, double> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    auto h = model.fit(batched, {.epochs = 2, .verbose = 0});
    return {model.get_weights(), std::move(h)};
}
}  // namespace

TEST_CASE("mask_zero with a per-token output: Synchronous equals one device on the rounds' batches (the servers divide by "
          "the tokens the update counted), with and without sample weights; one asynchronous worker is one device (float64)") {
    for (bool weighted : {false, true}) {
        CAPTURE(weighted);
        // 46 examples: mini-batches of 4 on 3 workers, rounds of 12, the last of 10 (4 + 4 + 2).
        const auto data = padded_sequences(46, weighted);
        dist::OneDevice<> one;
        const auto [reference, h1] = fit_masked(one, data.batch(12));
        for (int servers : {1, 2}) {
            CAPTURE(servers);
            dist::ParameterServer<Host, ss::Synchronous> ps(3, servers);
            const auto [w, h] = fit_masked(ps, data.batch(4));
            CHECK(max_relative_difference(w, reference) <= 1e-12);
            // The epoch's accuracy is over the same tokens with the same weights: one device's.
            for (std::size_t e = 0; e < 2; ++e) CHECK(h["accuracy"][e] == doctest::Approx(h1["accuracy"][e]).epsilon(1e-12));
        }
        dist::OneDevice<> sequential;
        const auto [small, hs] = fit_masked(sequential, data.batch(4));
        dist::ParameterServer<Host, ss::Asynchronous<>> async(1, 1);
        const auto [a, ha] = fit_masked(async, data.batch(4));
        CHECK(max_relative_difference(a, small) <= 1e-12);
        // Each mini-batch's loss is its mean over its tokens that count, an epoch's the mean of
        // those weighted by the examples, as one device's on the same batches.
        for (std::size_t e = 0; e < 2; ++e) CHECK(ha["loss"][e] == doctest::Approx(hs["loss"][e]).epsilon(1e-12));
    }
}

TEST_CASE("sharding does not change the arithmetic: any servers and partitioner give bitwise equal weights") {
    const auto data = dataset<Mlp>(40, 5).batch(4);
    const strata::optim::Optimizer opt = strata::optim::RMSprop{.learning_rate = 0.01};
    const auto ref = ps_train<ss::KBatchAsync<2>>(3, 1, {.clock = dist::Clock::Virtual, .stragglers = dist::Stragglers::exponential(1)}, data, opt);
    for (int servers : {2, 3})
        for (const dist::Partitioner& part : {dist::Partitioner{dist::FixedShards{3}}, dist::Partitioner{dist::MinSize{.min_shard_bytes = 16, .max_shards = 4}}}) {
            CAPTURE(servers);
            const auto w = ps_train<ss::KBatchAsync<2>>(
                3, servers, {.partitioner = part, .clock = dist::Clock::Virtual, .stragglers = dist::Stragglers::exponential(1)}, data, opt);
            CHECK(w == ref);
        }
}

TEST_CASE("equal compute times (virtual clock): KSync<W> and KBatchSync<W> are Synchronous, bitwise") {
    const auto data = dataset<Mlp>(50, 7).batch(4);
    const strata::optim::Optimizer opt = strata::optim::Adam{.learning_rate = 0.01};
    const dist::ParameterServerOptions o{.clock = dist::Clock::Virtual};
    const auto sync_w = ps_train<ss::Synchronous>(3, 2, o, data, opt);
    CHECK(ps_train<ss::KSync<3>>(3, 2, o, data, opt) == sync_w);
    CHECK(ps_train<ss::KBatchSync<3>>(3, 2, o, data, opt) == sync_w);
    // ...and a mode with other semantics is not (the check can fail).
    CHECK(ps_train<ss::KSync<2>>(3, 2, o, data, opt) != sync_w);
}

TEST_CASE("Asynchronous<0> is bulk synchronous: W updates per clock on the clock's parameters (= Synchronous with W× the rate, plain SGD)") {
    // Under Asynchronous<0> every worker computes clock c on the same version, and its gradient
    // is applied on arrival as an update of its own: with plain SGD at rate η that is
    // w − η Σ_workers mean-gradient, which Synchronous (one update of the mean over W
    // mini-batches) gives at rate W·η.
    const int workers = 3;
    const auto data = dataset<Mlp>(48, 9).batch(4);
    dist::ParameterServerStats stats;
    const auto async0 = ps_train<ss::Asynchronous<0>, Mlp, double>(workers, 2, {.clock = dist::Clock::Virtual}, data,
                                                                       strata::optim::SGD{.learning_rate = 0.05}, 2, &stats);
    const auto synchronous = ps_train<ss::Synchronous, Mlp, double>(workers, 2, {.clock = dist::Clock::Virtual}, data,
                                                                       strata::optim::SGD{.learning_rate = 0.05 * workers});
    CHECK(max_relative_difference(async0, synchronous) <= 1e-12);
    CHECK(stats.ssp_gap_max == 0);
    CHECK(stats.staleness_max == workers - 1);  // the last of a clock's W pushes sees W − 1 updates before it
    CHECK(stats.updates == 2 * 12);
    // Unbounded asynchrony differs (workers do not wait for each other's clock).
    const auto async_unbounded = ps_train<ss::Asynchronous<-1>, Mlp, double>(
        workers, 2, {.clock = dist::Clock::Virtual, .stragglers = dist::Stragglers::slow(0, 3)}, data, strata::optim::SGD{.learning_rate = 0.05});
    CHECK(max_relative_difference(async_unbounded, synchronous) > 1e-6);
}

TEST_CASE("one worker under any mode is sequential SGD (OneDevice on the same mini-batches)") {
    const auto data = dataset<Mlp>(30, 2).batch(4);
    const strata::optim::Optimizer opt = strata::optim::Adam{.learning_rate = 0.01};
    const auto ref = one_device<Mlp, double>(data, opt);
    const dist::ParameterServerOptions o{.clock = dist::Clock::Virtual, .stragglers = dist::Stragglers::exponential(2)};
    CHECK(max_relative_difference(ps_train<ss::Synchronous, Mlp, double>(1, 1, o, data, opt), ref) <= 1e-12);
    CHECK(max_relative_difference(ps_train<ss::KSync<1>, Mlp, double>(1, 2, o, data, opt), ref) <= 1e-12);
    CHECK(max_relative_difference(ps_train<ss::KBatchSync<1>, Mlp, double>(1, 1, o, data, opt), ref) <= 1e-12);
    CHECK(max_relative_difference(ps_train<ss::KAsync<1>, Mlp, double>(1, 3, o, data, opt), ref) <= 1e-12);
    CHECK(max_relative_difference(ps_train<ss::KBatchAsync<1>, Mlp, double>(1, 1, o, data, opt), ref) <= 1e-12);
    CHECK(max_relative_difference(ps_train<ss::Asynchronous<>, Mlp, double>(1, 2, o, data, opt), ref) <= 1e-12);
    CHECK(max_relative_difference(ps_train<ss::Asynchronous<0>, Mlp, double>(1, 2, o, data, opt), ref) <= 1e-12);
    // Real clock too: with one worker there is nothing to race.
    CHECK(max_relative_difference(ps_train<ss::Asynchronous<>, Mlp, double>(1, 2, {}, data, opt), ref) <= 1e-12);
}

TEST_CASE_TEMPLATE("virtual clock: the same seed gives bitwise equal weights, run after run", Sync, ss::Synchronous, ss::KSync<2>,
                   ss::KBatchSync<3>, ss::KAsync<2>, ss::KBatchAsync<2>, ss::Asynchronous<>, ss::Asynchronous<1>) {
    const auto data = dataset<Mlp>(60, 4).batch(4);
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.05, .momentum = 0.5};
    const dist::ParameterServerOptions o{.clock = dist::Clock::Virtual, .stragglers = dist::Stragglers::shifted_exponential(0.5, 1), .straggler_seed = 3};
    dist::ParameterServerStats a_stats, b_stats;
    const auto a = ps_train<Sync>(4, 2, o, data, opt, 2, &a_stats);
    const auto b = ps_train<Sync>(4, 2, o, data, opt, 2, &b_stats);
    CHECK(a == b);
    CHECK(a_stats.updates == b_stats.updates);
    CHECK(a_stats.cancelled == b_stats.cancelled);
    CHECK(a_stats.histogram == b_stats.histogram);
    CHECK(a_stats.seconds == b_stats.seconds);
}

TEST_CASE("schedules: who contributes to an update, what is cancelled, how stale") {
    const auto data = dataset<Mlp>(120, 8).batch(2);  // 60 mini-batches
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.05};
    // Worker 2 is 10× slower than workers 0 and 1.
    const dist::ParameterServerOptions o{.clock = dist::Clock::Virtual, .stragglers = dist::Stragglers::slow(2, 10)};
    dist::ParameterServerStats s;

    SUBCASE("Synchronous waits for the straggler every update") {
        ps_train<ss::Synchronous>(3, 1, o, data, opt, 1, &s);
        CHECK(s.updates == 20);
        CHECK(s.gradients == 60);
        CHECK(s.cancelled == 0);
        CHECK(s.staleness_max == 0);
        CHECK(s.seconds == doctest::Approx(20 * 10 * 0.001));
    }
    SUBCASE("KSync<2> takes the two fast workers and cancels the straggler each update") {
        ps_train<ss::KSync<2>>(3, 1, o, data, opt, 1, &s);
        CHECK(s.updates == 20);
        CHECK(s.gradients == 40);
        CHECK(s.cancelled == 20);
        CHECK(s.staleness_max == 0);
        CHECK(s.seconds == doctest::Approx(20 * 0.001));
    }
    SUBCASE("KBatchSync<3>: the fast workers compute extra batches on the same version") {
        ps_train<ss::KBatchSync<3>>(3, 1, o, data, opt, 1, &s);
        CHECK(s.gradients == 3 * s.updates);
        CHECK(s.staleness_max == 0);
        // Each update: two batches at t + 1 ms, the third at t + 2 ms; the straggler and the
        // other fast worker's second batch are cancelled.
        CHECK(s.cancelled == 2 * s.updates);
        CHECK(s.seconds == doctest::Approx(double(s.updates) * 0.002));
    }
    SUBCASE("KAsync<2>: the straggler is never cancelled; its gradients arrive stale") {
        ps_train<ss::KAsync<2>>(3, 1, o, data, opt, 1, &s);
        CHECK(s.cancelled == 0);
        CHECK(s.gradients == 2 * s.updates);
        CHECK(s.staleness_max >= 5);  // it computed on a version about ten updates old
        REQUIRE(s.histogram.size() > 1);
        CHECK(s.histogram[0] > s.histogram.back());
    }
    SUBCASE("KBatchAsync<2>: every finished worker goes on at once") {
        ps_train<ss::KBatchAsync<2>>(3, 1, o, data, opt, 1, &s);
        CHECK(s.cancelled == 0);
        CHECK(s.gradients == 60);
        CHECK(s.updates == 30);
        CHECK(s.staleness_max >= 5);
    }
    SUBCASE("Asynchronous<2>: the SSP gap never exceeds the bound, and without a bound it does") {
        ps_train<ss::Asynchronous<2>>(3, 1, o, data, opt, 1, &s);
        CHECK(s.ssp_gap_max == 2);
        CHECK(s.updates == 60);
        dist::ParameterServerStats u;
        ps_train<ss::Asynchronous<>>(3, 1, o, data, opt, 1, &u);
        CHECK(u.ssp_gap_max > 2);
        CHECK(u.staleness_max > s.staleness_max);
    }
}

TEST_CASE("History and fit: steps_per_epoch counts updates; per-epoch counts and the staleness histogram are recorded") {
    dist::ParameterServer<Host, ss::KBatchAsync<2>> ps(3, 2, {.clock = dist::Clock::Virtual, .stragglers = dist::Stragglers::exponential(1)});
    strata::Model<Mlp, decltype(ps)> model(ps, 3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
    const auto h = model.fit(dataset<Mlp>(200, 1).batch(4), {.epochs = 3, .steps_per_epoch = 7, .verbose = 0});
    REQUIRE(h["updates"].size() == 3);
    for (double u : h["updates"]) CHECK(u == 7);
    REQUIRE(h.staleness.size() == 3);
    for (const auto& hist : h.staleness) {
        std::int64_t n = 0;
        for (auto c : hist) n += c;
        CHECK(n == 14);  // 7 updates of 2 gradients
    }
    CHECK(h["seconds"][0] > 0);
    CHECK(h["staleness_mean"][0] >= 0);
    CHECK(model.gradient_path().stats().updates == 21);
}

TEST_CASE("evaluate, predict, train_step and checkpoints work under ParameterServer; a checkpoint moves to OneDevice and back") {
    strata_test::TempDir dir;
    dist::ParameterServer<Host, ss::KSync<2>> ps(3, 2, {.partitioner = dist::FixedShards{2}});
    strata::Model<Cnn, decltype(ps)> model(ps, 5);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    const auto data = dataset<Cnn>(48, 6);
    model.fit(data.batch(4), {.epochs = 1, .verbose = 0});
    const auto before = model.get_weights();
    // train_step: one update of the batch's slices.
    auto it = data.batch(9).iterate(0);
    const auto r = model.train_step(*it);
    CHECK(r.examples == 6);  // KSync<2> of 3 slices of 3: two are applied
    CHECK(model.get_weights() != before);

    const auto eval = model.evaluate(data.batch(10));
    const auto pred = model.predict(data.batch(7));
    model.save((dir / "ps.safetensors").string());

    dist::OneDevice<> one;
    strata::Model<Cnn, dist::OneDevice<>> single(one, 99);
    single.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    single.load((dir / "ps.safetensors").string());
    CHECK(single.get_weights() == model.get_weights());
    const auto eval1 = single.evaluate(data.batch(10));
    CHECK(eval1.loss == doctest::Approx(eval.loss).epsilon(1e-6));
    CHECK(eval1.accuracy == eval.accuracy);
    const auto pred1 = single.predict(data.batch(7));
    CHECK(max_relative_difference(strata::to_vector(pred1.view()), strata::to_vector(pred.view())) <= 1e-6);

    // ...and back: a OneDevice checkpoint into a ParameterServer with other shards, slots included.
    single.fit(data.batch(8), {.epochs = 1, .verbose = 0});
    single.save((dir / "one.safetensors").string());
    dist::ParameterServer<Host, ss::Synchronous> ps3(2, 3, {.partitioner = dist::MaxSize{.max_shard_bytes = 40}});
    strata::Model<Cnn, decltype(ps3)> back(ps3, 1);
    back.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    back.load((dir / "one.safetensors").string());
    CHECK(back.get_weights() == single.get_weights());
    // Same state: one more identical step on each gives the same weights.
    auto it2 = data.batch(8).iterate(0);
    single.train_step(*it2);
    back.train_step(*it2);
    CHECK(max_relative_difference(back.get_weights(), single.get_weights()) <= 1e-6);
}

TEST_CASE("the placement log says which server holds which shard") {
    std::vector<std::string> lines;
    strata::place::set_placement_log_sink([&](std::string_view l) { lines.emplace_back(l); });
    strata::place::set_log_device_placement(true);
    {
        dist::ParameterServer<Host, ss::Synchronous> ps(2, 2, {.partitioner = dist::FixedShards{2}});
        strata::Model<Mlp, decltype(ps)> model(ps, 1);
    }
    strata::place::set_log_device_placement(false);
    strata::place::set_placement_log_sink(nullptr);
    auto count = [&](const std::string& a, const std::string& b) {
        return std::count_if(lines.begin(), lines.end(), [&](const std::string& l) { return has(l, a) && has(l, b); });
    };
    // dense/kernel (5, 7): rows [0, 3) and [3, 5), round-robin over the two servers.
    CHECK(count("variable dense/kernel (5, 7) shard 0 rows [0, 3)", "/job:ps/task:0") == 1);
    CHECK(count("variable dense/kernel (5, 7) shard 1 rows [3, 5)", "/job:ps/task:1") == 1);
    CHECK(count("ParameterServer server 1", "/job:ps/task:1") == 1);
}

TEST_CASE("bad arguments are clear errors") {
    using PS = dist::ParameterServer<Host, ss::KSync<3>>;
    CHECK(has(error_of<strata::ValueError>([] { PS ps(2, 1); }), "K = 3 needs at least 3 workers, got 2"));
    CHECK(has(error_of<strata::ValueError>([] { PS ps(3, 0); }), "the number of servers must be >= 1, got 0"));
    CHECK(has(error_of<strata::ValueError>([] { PS ps(0, 1); }), "the number of workers must be >= 1, got 0"));
    CHECK(has(error_of<strata::ValueError>([] { PS ps(3, 1, {.partitioner = dist::FixedShards{0}}); }), "FixedShards"));
    CHECK(has(error_of<strata::ValueError>([] {
              PS ps(3, 1, {.partitioner = dist::FixedShards{9}});
              strata::Model<Mlp, PS> m(ps);
          }),
          "FixedShards(9) asks for more shards than any variable has rows (the largest axis 0 is 7)"));
    CHECK(has(error_of<strata::ValueError>([] { PS ps(3, 1, {.stragglers = dist::Stragglers::slow(5, 2)}); }),
              "worker 5 does not exist; expected a worker index in [0, 3)"));
    CHECK(has(error_of<strata::ValueError>([] { PS ps(3, 1, {.virtual_batch_seconds = 0}); }),
              "virtual_batch_seconds must be in (0, 1e9), got 0"));
    CHECK(has(error_of<strata::ValueError>([] { PS ps(3, 1, {.timeout = std::chrono::milliseconds(0)}); }),
              "timeout must be > 0 ms, got 0"));
    const int too_many = dist::max_replica_threads() + 1;
    CHECK(has(error_of<strata::ValueError>([&] { PS ps(3, too_many); }),
              std::to_string(too_many) + " servers (one thread each) on "));
}

TEST_CASE("the mode in force: rule, K, B and the name as the type fixes them or the options give them; each knob checked") {
    // The strategy resolves its mode once (ParameterServerConfig) and the path reads it at run
    // time: every way of naming a mode must give the same rule, K, B and name.
    auto mode = [](const auto& ps) {
        return std::string(ss::rule_name(ps.rule())) + " k=" + std::to_string(ps.k()) + " b=" +
               std::to_string(ps.staleness_bound()) + " " + ps.sync_name();
    };
    CHECK(mode(dist::ParameterServer<Host, ss::Synchronous>(3, 1)) == "sync k=0 b=-1 Synchronous");
    CHECK(mode(dist::ParameterServer<Host, ss::KSync<2>>(3, 1)) == "ksync k=2 b=-1 KSync<2>");
    CHECK(mode(dist::ParameterServer<Host, ss::KBatchSync<3>>(3, 1)) == "kbatch_sync k=3 b=-1 KBatchSync<3>");
    CHECK(mode(dist::ParameterServer<Host, ss::KAsync<ss::dynamic>>(3, 1, {.k = 2})) == "kasync k=2 b=-1 KAsync<2>");
    CHECK(mode(dist::ParameterServer<Host, ss::Asynchronous<>>(3, 1)) == "async k=1 b=-1 Asynchronous<-1>");
    CHECK(mode(dist::ParameterServer<Host, ss::Asynchronous<2>>(3, 1)) == "async k=1 b=2 Asynchronous<2>");
    CHECK(mode(dist::ParameterServer<Host, ss::Asynchronous<ss::dynamic>>(3, 1, {.staleness_bound = 4})) ==
          "async k=1 b=4 Asynchronous<4>");
    using AnyPs = dist::ParameterServer<Host, ss::Any>;
    CHECK(mode(AnyPs(3, 1, {.rule = ss::Rule::Synchronous})) == "sync k=0 b=-1 Synchronous");
    CHECK(mode(AnyPs(3, 1, {.rule = ss::Rule::KBatchSync, .k = 3})) == "kbatch_sync k=3 b=-1 KBatchSync<3>");
    CHECK(mode(AnyPs(3, 1, {.rule = ss::Rule::Asynchronous, .staleness_bound = 2})) == "async k=1 b=2 Asynchronous<2>");
    CHECK(mode(AnyPs(3, 1, {.rule = ss::Rule::Asynchronous})) == "async k=1 b=-1 Asynchronous<-1>");
    // The settings every process compares carry the same name.
    const AnyPs any(3, 1, {.rule = ss::Rule::KAsync, .k = 2});
    const auto settings = any.settings();
    CHECK(std::find(settings.begin(), settings.end(), std::pair<std::string, std::string>{"sync mode", "KAsync<2>"}) !=
          settings.end());
    // The bound: given where the type leaves it open, else the type's or none.
    CHECK(has(error_of<strata::ValueError>([] { dist::ParameterServer<Host, ss::Asynchronous<ss::dynamic>> ps(3, 1, {.staleness_bound = -2}); }),
              "ParameterServer<Asynchronous<sync::dynamic>>: ParameterServerOptions::staleness_bound must be >= 0, or -1 for "
              "unbounded, got -2"));
    CHECK(has(error_of<strata::ValueError>([] { AnyPs ps(3, 1, {.rule = ss::Rule::Asynchronous, .staleness_bound = -2}); }),
              "ParameterServer<sync::Any>: ParameterServerOptions::staleness_bound must be >= 0, or -1 for unbounded, got -2"));
    CHECK(has(error_of<strata::ValueError>([] { dist::ParameterServer<Host, ss::Asynchronous<2>> ps(3, 1, {.staleness_bound = 3}); }),
              "ParameterServer<Asynchronous<2>>: ParameterServerOptions::staleness_bound = 3 contradicts the mode's bound 2"));
    CHECK(has(error_of<strata::ValueError>([] { AnyPs ps(3, 1, {.rule = ss::Rule::KSync, .k = 2, .staleness_bound = 1}); }),
              "ParameterServer<KSync<2>>: a staleness bound means nothing for this mode"));
    // K: the run's workers bound it, whoever gave it.
    CHECK(has(error_of<strata::ValueError>([] { AnyPs ps(2, 1, {.rule = ss::Rule::KAsync, .k = 3}); }),
              "ParameterServer<KAsync<3>>: K = 3 needs at least 3 workers, got 2"));
}

TEST_CASE("a worker that throws is named, and nothing hangs") {
    using PS = dist::ParameterServer<Host, ss::KBatchSync<2>>;
    PS ps(3, 1, {.timeout = std::chrono::seconds(20)});
    dist::GradientPath<PS, Mlp, float> path(ps, [](float* p) { std::fill_n(p, Mlp::num_params, 0.1f); });
    path.compile(strata::optim::SGD{.learning_rate = 0.1}, {});
    const auto data = dataset<Mlp>(40, 2).batch(2);
    auto it = data.iterate(0);
    dist::detail::IteratorSource<std::int32_t, decltype(it)> source(it);
    std::uint64_t step = 0;
    int calls = 0;
    auto work = [&](int w, const dist::ReplicaBatch<std::int32_t>& b, const float*, float* grads, double, std::uint64_t,
                    auto&& on_ready) -> dist::UnitWork {
        if (w == 1) throw strata::ValueError("bad record in shard 7");
        std::fill_n(grads, Mlp::num_params, 1.0f);
        on_ready(0, Mlp::num_params);
        return {0.0, 0, b.size, double(b.size)};
    };
    const auto t0 = std::chrono::steady_clock::now();
    const auto msg = error_of<strata::DistributedError>([&] { path.run_epoch(source, step, work, [&](const auto&) { return ++calls < 1000; }); });
    CHECK(msg == "ParameterServer: worker 1 of 3 failed: bad record in shard 7");
    // Promptly: far below the 20 s timeout.
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));

    SUBCASE("a worker that does not finish is named at the timeout") {
        PS slow_ps(2, 1, {.timeout = std::chrono::milliseconds(200)});
        dist::GradientPath<PS, Mlp, float> p2(slow_ps, [](float* p) { std::fill_n(p, Mlp::num_params, 0.1f); });
        p2.compile(strata::optim::SGD{.learning_rate = 0.1}, {});
        auto it2 = data.iterate(0);
        dist::detail::IteratorSource<std::int32_t, decltype(it2)> src2(it2);
        auto stuck = [&](int w, const dist::ReplicaBatch<std::int32_t>& b, const float*, float* grads, double, std::uint64_t,
                         auto&&) -> dist::UnitWork {
            if (w == 0) std::this_thread::sleep_for(std::chrono::milliseconds(800));
            std::fill_n(grads, Mlp::num_params, 1.0f);
            return {0.0, 0, b.size, double(b.size)};
        };
        const auto m = error_of<strata::DistributedError>([&] { p2.run_epoch(src2, step, stuck, [](const auto&) { return true; }); });
        CHECK(has(m, "ParameterServer: worker"));
        CHECK(has(m, " 0 of 2 did not finish"));
        CHECK(has(m, "within 200 ms"));
    }
}

TEST_CASE("real clock: every mode trains and ends; KSync cancels a slow worker promptly") {
    const auto data = dataset<Mlp>(64, 3).batch(4);
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.05};
    dist::ParameterServerStats s;
    ps_train<ss::KSync<1>>(2, 1, {.stragglers = dist::Stragglers::exponential(0.002)}, data, opt, 1, &s);
    CHECK(s.updates >= 8);
    CHECK(s.gradients == s.updates);
    CHECK(s.cancelled + s.dropped == s.updates);  // the other worker each round
    ps_train<ss::KBatchSync<2>>(2, 1, {}, data, opt, 1, &s);
    CHECK(s.gradients <= 2 * s.updates);
    CHECK(s.gradients >= 2 * s.updates - 1);  // the last update may be partial when the data runs out
    ps_train<ss::KAsync<1>>(2, 2, {}, data, opt, 1, &s);
    CHECK(s.gradients == 16);
    ps_train<ss::Asynchronous<1>>(3, 2, {}, data, opt, 1, &s);
    CHECK(s.updates == 16);
    CHECK(s.ssp_gap_max <= 1);
}

TEST_CASE("real clock: Ctrl-C (StopOnSignal) ends a straggler's injected delay; fit stops after the step") {
    // Every mini-batch sleeps at least 600 s (shift); SIGINT arrives 300 ms in. The workers wake
    // within a slice, the step completes, StopOnSignal stops fit. Without it, the coordinator
    // would wait for its 20 s timeout and throw.
    const auto data = dataset<Mlp>(64, 3).batch(4);
    dist::ParameterServer<Host, ss::Synchronous> ps(
        2, 1, {.stragglers = dist::Stragglers::shifted_exponential(600, 1), .timeout = std::chrono::seconds(20)});
    strata::Model<Mlp, decltype(ps)> model(ps, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
    struct sigaction before {};
    ::sigaction(SIGINT, nullptr, &before);
    auto stop = std::make_shared<strata::train::StopOnSignal>();
    std::thread signaller([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::kill(::getpid(), SIGINT);
    });
    const auto t0 = std::chrono::steady_clock::now();
    std::string error;
    try {
        model.fit(data, {.epochs = 3, .callbacks = {stop}, .verbose = 0});
    } catch (const strata::Error& e) {
        error = e.what();
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    signaller.join();
    CHECK(error == "");
    CHECK(stop->interrupted());
    CHECK(stop->signal_number() == SIGINT);
    CHECK(stop->exit_status() == 130);
    CHECK(took < std::chrono::seconds(10));
    CHECK(model.gradient_path().stats().updates <= 2);
    // Released (or destroyed), the handlers are the previous ones again and the flag is clear
    // for the next run.
    stop->release();
    struct sigaction now {};
    ::sigaction(SIGINT, nullptr, &now);
    CHECK((now.sa_handler == before.sa_handler));
    stop.reset();
    CHECK(strata::stop_signal().load() == 0);
}

TEST_CASE("K and B given at run time (sync::dynamic) train exactly as the static ones; missing or contradicting knobs are errors") {
    const auto data = dataset<Mlp>(60, 4).batch(4);
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.05};
    const dist::ParameterServerOptions o{.clock = dist::Clock::Virtual, .stragglers = dist::Stragglers::exponential(1)};
    auto with = [&](int k, int b) {
        auto d = o;
        d.k = k;
        d.staleness_bound = b;
        return d;
    };
    CHECK(ps_train<ss::KSync<ss::dynamic>>(3, 2, with(2, -1), data, opt) == ps_train<ss::KSync<2>>(3, 2, o, data, opt));
    CHECK(ps_train<ss::KBatchAsync<ss::dynamic>>(3, 1, with(3, -1), data, opt) == ps_train<ss::KBatchAsync<3>>(3, 1, o, data, opt));
    CHECK(ps_train<ss::Asynchronous<ss::dynamic>>(3, 1, with(0, 1), data, opt) == ps_train<ss::Asynchronous<1>>(3, 1, o, data, opt));
    using Dyn = dist::ParameterServer<Host, ss::KSync<ss::dynamic>>;
    CHECK(has(error_of<strata::ValueError>([] { Dyn ps(3, 1); }), "give K in ParameterServerOptions::k (>= 1), got 0"));
    CHECK(has(error_of<strata::ValueError>([] { Dyn ps(3, 1, {.k = 4}); }), "K = 4 needs at least 4 workers, got 3"));
    using Static = dist::ParameterServer<Host, ss::KSync<2>>;
    CHECK(has(error_of<strata::ValueError>([] { Static ps(3, 1, {.k = 3}); }), "ParameterServerOptions::k = 3 contradicts the mode's K = 2"));
    using Sync = dist::ParameterServer<Host, ss::Synchronous>;
    CHECK(has(error_of<strata::ValueError>([] { Sync ps(3, 1, {.k = 2}); }), "means nothing for this mode"));
    CHECK(has(error_of<strata::ValueError>([] { Sync ps(3, 1, {.staleness_bound = 2}); }), "a staleness bound means nothing"));
}

TEST_CASE("sync::Any: the mode chosen at run time trains bitwise as its compile-time tag; a missing or contradicting rule is an error") {
    const auto data = dataset<Mlp>(60, 5).batch(4);
    const strata::optim::Optimizer opt = strata::optim::SGD{.learning_rate = 0.05};
    const dist::ParameterServerOptions o{.clock = dist::Clock::Virtual, .stragglers = dist::Stragglers::exponential(1)};
    auto any = [&](ss::Rule rule, int k, int b) {
        auto d = o;
        d.rule = rule;
        d.k = k;
        d.staleness_bound = b;
        return d;
    };
    // Every rule, under stragglers that make the modes differ from one another (checked below).
    const auto sync = ps_train<ss::Any>(3, 2, any(ss::Rule::Synchronous, 0, -1), data, opt);
    CHECK(sync == ps_train<ss::Synchronous>(3, 2, o, data, opt));
    const auto ksync = ps_train<ss::Any>(3, 2, any(ss::Rule::KSync, 2, -1), data, opt);
    CHECK(ksync == ps_train<ss::KSync<2>>(3, 2, o, data, opt));
    CHECK(ps_train<ss::Any>(3, 2, any(ss::Rule::KBatchSync, 2, -1), data, opt) == ps_train<ss::KBatchSync<2>>(3, 2, o, data, opt));
    CHECK(ps_train<ss::Any>(3, 1, any(ss::Rule::KAsync, 2, -1), data, opt) == ps_train<ss::KAsync<2>>(3, 1, o, data, opt));
    CHECK(ps_train<ss::Any>(3, 1, any(ss::Rule::KBatchAsync, 3, -1), data, opt) == ps_train<ss::KBatchAsync<3>>(3, 1, o, data, opt));
    const auto async = ps_train<ss::Any>(3, 1, any(ss::Rule::Asynchronous, 0, 1), data, opt);
    CHECK(async == ps_train<ss::Asynchronous<1>>(3, 1, o, data, opt));
    CHECK(sync != ksync);  // the rule really changes the schedule
    CHECK(sync != async);
    using AnyPs = dist::ParameterServer<Host, ss::Any>;
    CHECK(has(error_of<strata::ValueError>([] { AnyPs ps(3, 1); }), "choose the mode in ParameterServerOptions::rule"));
    CHECK(has(error_of<strata::ValueError>([] { AnyPs ps(3, 1, {.rule = ss::Rule::KSync}); }), "give K in ParameterServerOptions::k (>= 1), got 0"));
    CHECK(has(error_of<strata::ValueError>([] { AnyPs ps(3, 1, {.rule = ss::Rule::Synchronous, .k = 2}); }), "means nothing for this mode"));
    CHECK(AnyPs(3, 1, {.rule = ss::Rule::KBatchAsync, .k = 2}).sync_name() == "KBatchAsync<2>");
    using Static = dist::ParameterServer<Host, ss::KSync<2>>;
    CHECK(has(error_of<strata::ValueError>([] { Static ps(3, 1, {.rule = ss::Rule::KAsync}); }), "rule = kasync contradicts the type's mode"));
}

TEST_CASE("cancelled work stops between layers of backward, not at the end of the mini-batch") {
    // Worker 1's backward has 400 "layers" of 2 ms each; worker 0 finishes at once. Under
    // KSync<1> worker 0's push closes every update and worker 1 is cancelled: it must stop at
    // its next layer boundary, far from the end of its mini-batch.
    using PS = dist::ParameterServer<Host, ss::KSync<1>>;
    PS ps(2, 1, {.timeout = std::chrono::seconds(30)});
    dist::GradientPath<PS, Mlp, float> path(ps, [](float* p) { std::fill_n(p, Mlp::num_params, 0.1f); });
    path.compile(strata::optim::SGD{.learning_rate = 0.1}, {});
    const auto data = dataset<Mlp>(16, 2).batch(2);
    auto it = data.iterate(0);
    dist::detail::IteratorSource<std::int32_t, decltype(it)> source(it);
    std::uint64_t step = 0;
    std::atomic<int> slow_layers{0}, slow_batches{0};
    auto work = [&](int w, const dist::ReplicaBatch<std::int32_t>& b, const float*, float* grads, double, std::uint64_t,
                    auto&& on_ready) -> dist::UnitWork {
        std::fill_n(grads, Mlp::num_params, 1.0f);
        if (w == 1) {
            ++slow_batches;
            for (int layer = 0; layer < 400; ++layer) {
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
                ++slow_layers;
                on_ready(0, Mlp::num_params);
            }
        }
        return {0.0, 0, b.size, double(b.size)};
    };
    path.run_epoch(source, step, work, [](const auto&) { return true; });
    const auto& s = path.stats();
    CHECK(s.updates == 4);                  // 8 mini-batches, rounds of 2, the fast one wins each
    CHECK(s.cancelled + s.dropped == 4);    // the slow one, every round
    CHECK(slow_batches.load() == 4);
    CHECK(slow_layers.load() < 4 * 400 / 4);  // each stopped within its first quarter
}
