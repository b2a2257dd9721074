// The parameter-server strategy's parts: TF's variable partitioners (the outputs TF documents),
// the "div" split, round-robin placement, and the seeded straggler model (determinism, moments,
// the command-line form, its ranges, and the real clock's interruptible delay). Deterministic:
// fixed seeds; the only timing is a delay that must end well before its length. Then the parts
// of the path's core that stand alone: each sync mode's admission rule, moved by a scripted epoch
// (ps_admission.hpp), and the virtual clock's order of events (ps_clock.hpp).
#include <doctest/doctest.h>

#include <strata/distribute/partitioner.hpp>
#include <strata/distribute/ps_admission.hpp>
#include <strata/distribute/ps_clock.hpp>
#include <strata/distribute/straggler.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test_util.hpp"

using strata::ValueError;
using strata_test::error_of;
using strata_test::has;
namespace sd = strata::distribute;

namespace {

using Dims = std::vector<std::int64_t>;

int shards_of(const sd::Partitioner& p, Dims shape, std::size_t element_bytes = sizeof(float)) {
    return sd::num_shards(p, shape, element_bytes);
}

}  // namespace

TEST_CASE("partitioner: TF's documented shard counts") {
    // tf.distribute.experimental.partitioners docstrings (sharded_variable.py).
    CHECK(shards_of(sd::FixedShards{2}, {10, 3}) == 2);
    CHECK(shards_of(sd::MinSize{4, 2}, {6, 1}) == 2);
    CHECK(shards_of(sd::MinSize{4, 10}, {6, 1}) == 6);
    CHECK(shards_of(sd::MaxSize{4}, {6, 1}) == 6);
    CHECK(shards_of(sd::MaxSize{4, 2}, {6, 1}) == 2);
    CHECK(shards_of(sd::MaxSize{1024}, {6, 1}) == 1);
    // min_max_variable_partitioner's docstring: f32 [1024, 1024] at 256 KiB per shard -> 16, capped by max.
    CHECK(shards_of(sd::MinSize{256 << 10, 100}, {1024, 1024}) == 16);
    CHECK(shards_of(sd::MinSize{256 << 10, 3}, {1024, 1024}) == 3);
    CHECK(shards_of(sd::MinSize{}, {1024, 1024}) == 1);  // default max_shards = 1
    CHECK(shards_of(sd::Partitioner{}, {1024, 1024}) == 1);
}

TEST_CASE("partitioner: arithmetic at the edges") {
    // A variable never gets more shards than rows.
    CHECK(shards_of(sd::FixedShards{8}, {3, 5}) == 3);
    CHECK(shards_of(sd::MinSize{1, 1000}, {3, 5}) == 3);
    CHECK(shards_of(sd::MaxSize{1}, {3, 5}) == 3);  // a row (20 B) over the limit is still not split
    // MinSize rounds up: 24 B at 10 B per shard -> ceil(2.4) = 3.
    CHECK(shards_of(sd::MinSize{10, 10}, {6, 1}) == 3);
    // MaxSize: rows per shard = floor(10 / 4) = 2, shards = ceil(6 / 2) = 3; 7 rows -> 4.
    CHECK(shards_of(sd::MaxSize{10}, {6, 1}) == 3);
    CHECK(shards_of(sd::MaxSize{10}, {7, 1}) == 4);
    // Rows of several elements: [100, 8] f64 rows are 64 B; 256 B -> 4 rows per shard -> 25 shards.
    CHECK(shards_of(sd::MaxSize{256}, {100, 8}, 8) == 25);
    CHECK(shards_of(sd::MinSize{1600, 100}, {100, 8}, 8) == 4);
    // Rank 1 and zero-size rows.
    CHECK(shards_of(sd::FixedShards{4}, {10}) == 4);
    CHECK(shards_of(sd::MaxSize{4}, {5, 0}) == 1);
    CHECK(shards_of(sd::MinSize{4, 4}, {5, 0}) == 1);
    // Strings count bytes_per_string per element, as TF does for dtype string.
    CHECK(shards_of(sd::MaxSize{32}, {6, 1}, sd::string_element_bytes) == 3);
    CHECK(shards_of(sd::MaxSize{32, 0, 8}, {6, 1}, sd::string_element_bytes) == 2);
    CHECK(shards_of(sd::MinSize{16, 10, 16}, {6, 1}, sd::string_element_bytes) == 6);
}

TEST_CASE("partitioner: bad arguments are ValueErrors that say what was expected") {
    auto msg = [](const sd::Partitioner& p, Dims shape) {
        return error_of<ValueError>([&] { (void)sd::num_shards(p, shape, 4); });
    };
    CHECK(has(msg(sd::FixedShards{0}, {4}), "num_shards must be >= 1, found 0"));
    CHECK(has(msg(sd::MinSize{0, 1}, {4}), "min_shard_bytes must be >= 1, found 0"));
    CHECK(has(msg(sd::MinSize{4, 0}, {4}), "max_shards must be >= 1, found 0"));
    CHECK(has(msg(sd::MinSize{4, 1, 0}, {4}), "bytes_per_string must be >= 1, found 0"));
    CHECK(has(msg(sd::MaxSize{}, {4}), "max_shard_bytes must be >= 1, found 0"));
    CHECK(has(msg(sd::MaxSize{4, -1}, {4}), "max_shards must be >= 1, or 0 for no cap, found -1"));
    CHECK(has(msg(sd::FixedShards{2}, {}), "rank >= 1, found a scalar"));
    CHECK(has(msg(sd::MinSize{4, 2}, {0, 3}), "first extent >= 1, found shape [0, 3]"));
    CHECK(has(msg(sd::MaxSize{4}, {3, -1}), "extents >= 0, found shape [3, -1]"));
    CHECK(has(error_of<ValueError>([] { (void)sd::shard_rows(10, 0); }), "expected shards >= 1, found 0"));
    CHECK(has(error_of<ValueError>([] { (void)sd::shard_rows(3, 5); }), "rows >= 5), found 3 rows"));
    CHECK(has(error_of<ValueError>([] { (void)sd::plan_shards(sd::FixedShards{2}, {{4}}, {0}, 4, 0); }),
              "expected servers >= 1, found 0"));
    CHECK(has(error_of<ValueError>([] { (void)sd::plan_shards(sd::FixedShards{2}, {{4}, {3}}, {0}, 4, 1); }),
              "one offset per variable (2), found 1"));
    CHECK(has(error_of<ValueError>([] { (void)sd::plan_shards(sd::FixedShards{2}, {{4}, {0, 2}}, {0, 4}, 4, 1); }),
              "variable 1: num_shards"));
    // Unpartitioned, nothing about the shape is asked: TF places such variables whole.
    CHECK(sd::num_shards(sd::Partitioner{}, Dims{}, 4) == 1);
}

TEST_CASE("partitioner: div split of rows") {
    CHECK(sd::shard_rows(13, 5) == Dims{3, 3, 3, 2, 2});  // TF: [[0,1,2],[3,4,5],[6,7,8],[9,10],[11,12]]
    CHECK(sd::shard_rows(10, 4) == Dims{3, 3, 2, 2});      // parameter_server_strategy_v2.py's example
    CHECK(sd::shard_rows(6, 3) == Dims{2, 2, 2});
    CHECK(sd::shard_rows(7, 1) == Dims{7});
    CHECK(sd::shard_rows(5, 5) == Dims{1, 1, 1, 1, 1});
}

TEST_CASE("partitioner: plan_shards splits by rows and places shards round-robin") {
    // Variables: [13, 2] at 0, [4] at 26, scalar at 30, [3, 3] at 31; FixedShards(5) over 3 servers.
    const auto plan = sd::plan_shards(sd::FixedShards{5}, {{13, 2}, {4}, {}, {3, 3}}, {0, 26, 30, 31}, 4, 3);
    const std::vector<sd::ShardRange> expected = {
        {0, 0, 0, 3, 0, 6, 0},   {0, 1, 3, 3, 6, 6, 1},   {0, 2, 6, 3, 12, 6, 2},  {0, 3, 9, 2, 18, 4, 0},
        {0, 4, 11, 2, 22, 4, 1}, {1, 0, 0, 1, 26, 1, 2},  {1, 1, 1, 1, 27, 1, 0},  {1, 2, 2, 1, 28, 1, 1},
        {1, 3, 3, 1, 29, 1, 2},  {2, 0, 0, 1, 30, 1, 0},  // the scalar is not partitioned (as in TF)
        {3, 0, 0, 1, 31, 3, 1},  {3, 1, 1, 1, 34, 3, 2},  {3, 2, 2, 1, 37, 3, 0},
    };
    REQUIRE(plan.size() == expected.size());
    for (std::size_t i = 0; i < plan.size(); ++i) {
        CAPTURE(i);
        CHECK(plan[i] == expected[i]);
    }
    // The shards of each variable tile its elements exactly.
    std::int64_t next = 0;
    for (const auto& s : plan) {
        CHECK(s.first == next);
        next = s.first + s.count;
    }
    CHECK(next == 40);

    // Unpartitioned: one shard per variable, placed round-robin (TF's variable_partitioner=None).
    const auto whole = sd::plan_shards(sd::Partitioner{}, {{13, 2}, {4}, {3, 3}}, {0, 26, 30}, 4, 2);
    REQUIRE(whole.size() == 3);
    CHECK(whole[0] == sd::ShardRange{0, 0, 0, 13, 0, 26, 0});
    CHECK(whole[1] == sd::ShardRange{1, 0, 0, 4, 26, 4, 1});
    CHECK(whole[2] == sd::ShardRange{2, 0, 0, 3, 30, 9, 0});

    // TF's recommended default: at least 256 KiB per shard, at most one shard per server.
    const auto big = sd::plan_shards(sd::MinSize{256 << 10, 4}, {{1024, 1024}, {1024}}, {0, 1 << 20}, 4, 4);
    REQUIRE(big.size() == 5);
    for (int s = 0; s < 4; ++s) CHECK(big[std::size_t(s)].count == 256 * 1024);
    CHECK(big[4] == sd::ShardRange{1, 0, 0, 1024, 1 << 20, 1024, 0});
}

TEST_CASE("partitioner: describe") {
    CHECK(sd::describe(sd::Partitioner{}) == "None");
    CHECK(sd::describe(sd::FixedShards{2}) == "FixedShards(2)");
    CHECK(sd::describe(sd::MinSize{}) == "MinSize(262144 B, max 1)");
    CHECK(sd::describe(sd::MinSize{1024, 4, 32}) == "MinSize(1024 B, max 4, 32 B/string)");
    CHECK(sd::describe(sd::MaxSize{1024}) == "MaxSize(1024 B)");
    CHECK(sd::describe(sd::MaxSize{4, 2}) == "MaxSize(4 B, max 2)");
}

TEST_CASE("stragglers: draws are pure functions of (seed, worker, n)") {
    for (const auto& s : {sd::Stragglers::exponential(0.01), sd::Stragglers::shifted_exponential(0.002, 0.01)}) {
        CAPTURE(s.describe());
        const double a = s.compute_seconds(42, 1, 7, 0.5);
        CHECK(a == s.compute_seconds(42, 1, 7, 0.5));
        CHECK(a == sd::Stragglers(s).compute_seconds(42, 1, 7, 0.0));  // base is not used by random models
        CHECK(a != s.compute_seconds(42, 1, 8, 0.5));
        CHECK(a != s.compute_seconds(42, 2, 7, 0.5));
        CHECK(a != s.compute_seconds(43, 1, 7, 0.5));
        // The injected delay under the real clock is the same draw, whatever was measured.
        CHECK(s.delay_seconds(42, 1, 7, 0.123) == a);
        CHECK(a >= (s.kind() == sd::Stragglers::Kind::ShiftedExponential ? 0.002 : 0.0));
    }
    // Order does not matter: a worker's draws read backwards equal the forward ones.
    const auto e = sd::Stragglers::exponential(1.0);
    std::vector<double> forward, backward(100);
    for (std::uint64_t n = 0; n < 100; ++n) forward.push_back(e.compute_seconds(7, 3, n, 0));
    for (std::uint64_t n = 100; n-- > 0;) backward[n] = e.compute_seconds(7, 3, n, 0);
    CHECK(forward == backward);
    CHECK(std::set<double>(forward.begin(), forward.end()).size() == forward.size());
}

TEST_CASE("stragglers: sample moments match the model") {
    constexpr int draws = 100000;
    auto moments = [](const sd::Stragglers& s, int worker) {
        double sum = 0, sum2 = 0;
        for (std::uint64_t n = 0; n < std::uint64_t(draws); ++n) {
            const double x = s.compute_seconds(2024, worker, n, 0);
            sum += x;
            sum2 += x * x;
        }
        const double mean = sum / draws;
        return std::pair{mean, (sum2 - draws * mean * mean) / (draws - 1)};
    };
    const auto e = sd::Stragglers::exponential(0.010);
    CHECK(e.mean_seconds(0, 123) == doctest::Approx(0.010));
    for (int worker : {0, 5}) {
        const auto [mean, var] = moments(e, worker);
        CHECK(std::abs(mean / 0.010 - 1) < 0.01);
        CHECK(std::abs(var / (0.010 * 0.010) - 1) < 0.03);
    }
    const auto se = sd::Stragglers::shifted_exponential(0.002, 0.010);
    CHECK(se.mean_seconds(0, 123) == doctest::Approx(0.012));
    const auto [mean, var] = moments(se, 1);
    CHECK(std::abs(mean / 0.012 - 1) < 0.01);
    CHECK(std::abs(var / (0.010 * 0.010) - 1) < 0.03);  // the shift adds nothing to the variance
}

TEST_CASE("stragglers: slow factors and none") {
    const auto none = sd::Stragglers::none();
    CHECK(none.kind() == sd::Stragglers::Kind::None);
    CHECK(none.compute_seconds(1, 3, 9, 0.25) == 0.25);
    CHECK(none.delay_seconds(1, 3, 9, 0.25) == 0.0);
    CHECK(none.mean_seconds(3, 0.25) == 0.25);

    const auto one = sd::Stragglers::slow(1, 4.0);
    CHECK(one.kind() == sd::Stragglers::Kind::Slow);
    CHECK(one.compute_seconds(1, 0, 0, 0.5) == 0.5);
    CHECK(one.compute_seconds(1, 1, 0, 0.5) == 2.0);
    CHECK(one.compute_seconds(1, 2, 0, 0.5) == 0.5);
    CHECK(one.delay_seconds(1, 1, 0, 0.5) == 1.5);  // measured + delay = 4 × measured
    CHECK(one.delay_seconds(1, 0, 0, 0.5) == 0.0);
    CHECK(one.mean_seconds(1, 0.5) == 2.0);

    const auto per = sd::Stragglers::slow(std::vector<double>{1.0, 2.0, 3.5});
    CHECK(per.compute_seconds(0, 2, 0, 2.0) == 7.0);
    CHECK(per.delay_seconds(0, 1, 0, 2.0) == 2.0);
    CHECK(per.mean_seconds(0, 2.0) == 2.0);
    CHECK(has(error_of<ValueError>([&] { (void)per.compute_seconds(0, 3, 0, 1.0); }), "worker 3 has no slowdown factor"));

    // validate: the slow worker must exist; per-worker factors must number the workers.
    CHECK_NOTHROW(one.validate(2));
    CHECK(has(error_of<ValueError>([&] { one.validate(1); }), "worker 1 does not exist; expected a worker index in [0, 1)"));
    CHECK_NOTHROW(per.validate(3));
    CHECK(has(error_of<ValueError>([&] { per.validate(4); }), "one slowdown factor per worker (4), found 3"));
    CHECK(has(error_of<ValueError>([] { sd::Stragglers::none().validate(0); }), "at least 1 worker, found 0"));

    CHECK(has(error_of<ValueError>([] { (void)sd::Stragglers::slow(0, 0.5); }), "factor >= 1 and <= 1e+06, found 0.5"));
    CHECK(has(error_of<ValueError>([] { (void)sd::Stragglers::slow(-1, 2.0); }), "worker index >= 0, found -1"));
    CHECK(has(error_of<ValueError>([] { (void)sd::Stragglers::slow(std::vector<double>{}); }), "found none"));
    CHECK(has(error_of<ValueError>([] { (void)sd::Stragglers::exponential(0); }), "mean > 0 s and <= 86400 s (one day), found 0"));
    CHECK(has(error_of<ValueError>([] { (void)sd::Stragglers::shifted_exponential(-1, 1); }), "shift >= 0 s and <= 86400 s (one day), found -1"));
}

TEST_CASE("stragglers: parse and describe") {
    using K = sd::Stragglers::Kind;
    const auto none = sd::Stragglers::parse("none");
    CHECK(none.kind() == K::None);
    CHECK(none.describe() == "none");

    const auto slow = sd::Stragglers::parse("slow:1:4");
    CHECK(slow.kind() == K::Slow);
    CHECK(slow.factor(1) == 4.0);
    CHECK(slow.factor(0) == 1.0);
    CHECK(slow.describe() == "slow: worker 1 ×4");
    CHECK(sd::Stragglers::parse("slow:0:2.5").describe() == "slow: worker 0 ×2.5");
    CHECK(sd::Stragglers::slow(std::vector<double>{1, 4, 1}).describe() == "slow: ×{1, 4, 1}");

    const auto exp = sd::Stragglers::parse("exp:10");
    CHECK(exp.kind() == K::Exponential);
    CHECK(exp.mean_seconds(0, 0) == doctest::Approx(0.010));
    CHECK(exp.describe() == "Exp(mean 10 ms)");
    CHECK(sd::Stragglers::parse("exp:0.5").mean_seconds(0, 0) == doctest::Approx(0.0005));

    const auto sexp = sd::Stragglers::parse("sexp:2:10");
    CHECK(sexp.kind() == K::ShiftedExponential);
    CHECK(sexp.mean_seconds(0, 0) == doctest::Approx(0.012));
    CHECK(sexp.describe() == "2 ms + Exp(mean 10 ms)");
    CHECK(sd::Stragglers::parse("sexp:0:1e1").mean_seconds(0, 0) == doctest::Approx(0.010));

    // Parsed and built models draw the same numbers.
    CHECK(sexp.compute_seconds(5, 2, 11, 0) == sd::Stragglers::shifted_exponential(0.002, 0.010).compute_seconds(5, 2, 11, 0));

    for (const char* junk : {"exp:", "exp:-1", "exp:0", "exp:1e400", "exp:5x", "exp: 5", "exp:+5", "exp:nan",
                             "exp:inf", "slow:1", "slow:a:2", "slow:1:0.5", "slow:-1:2", "slow:1.0:2", "slow:1:2:3",
                             "sexp:1:2:3", "sexp:-1:2", "sexp:1", "none:", "None", "uniform:3", "exp:10ms"}) {
        CAPTURE(junk);
        const auto msg = error_of<ValueError>([&] { (void)sd::Stragglers::parse(junk); });
        CHECK(has(msg, std::string("\"") + junk + "\""));
        CHECK(has(msg, "none, slow:WORKER:FACTOR, exp:MEAN_MS, sexp:SHIFT_MS:MEAN_MS"));
    }
}

TEST_CASE("stragglers: an empty value and durations out of range are named, with the range") {
    const auto empty = error_of<ValueError>([] { (void)sd::Stragglers::parse(""); });
    CHECK(has(empty, "empty value; expected none | slow:WORKER:FACTOR | exp:MEAN_MS | sexp:SHIFT_MS:MEAN_MS"));
    CHECK(!has(empty, "\"\""));
    // A factor of 1e12 once overflowed the real clock's wait into no wait at all.
    for (const auto& [spec, says] : {std::pair{"slow:1:1e12", "FACTOR must be a finite number >= 1 and <= 1e+06, found \"1e12\""},
                                     std::pair{"exp:1e12", "MEAN_MS must be a finite number > 0 and <= 8.64e+07, found \"1e12\""},
                                     std::pair{"sexp:1e12:5", "SHIFT_MS must be a finite number >= 0 and <= 8.64e+07"},
                                     std::pair{"sexp:5:1e12", "MEAN_MS must be a finite number > 0 and <= 8.64e+07"}}) {
        CAPTURE(spec);
        CHECK(has(error_of<ValueError>([&] { (void)sd::Stragglers::parse(spec); }), says));
    }
    CHECK_NOTHROW((void)sd::Stragglers::parse("slow:1:1e6"));
    CHECK_NOTHROW((void)sd::Stragglers::parse("exp:86400000"));
    CHECK(has(error_of<ValueError>([] { (void)sd::Stragglers::slow(1, 1e12); }), "factor >= 1 and <= 1e+06, found 1e+12"));
    CHECK(has(error_of<ValueError>([] { (void)sd::Stragglers::slow(std::vector<double>{1, 2e6}); }), "found 2e+06"));
    CHECK(has(error_of<ValueError>([] { (void)sd::Stragglers::exponential(1e9); }), "mean > 0 s and <= 86400 s (one day), found 1e+09"));
    CHECK(has(error_of<ValueError>([] { (void)sd::Stragglers::shifted_exponential(1e9, 1); }), "found 1e+09"));
}

TEST_CASE("stragglers: a real-clock delay is range-checked, ends when done, and ends at a stop request (Ctrl-C)") {
    std::mutex m;
    std::condition_variable cv;
    std::unique_lock<std::mutex> lock(m);
    for (double bad : {1e12, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
        CAPTURE(bad);
        const auto msg = error_of<ValueError>([&] { sd::Stragglers::sleep(cv, lock, bad, [] { return false; }); });
        CHECK(has(msg, "an injected delay must be finite, >= 0 s and <= 1e+07 s, found "));
    }
    CHECK(!sd::Stragglers::sleep(cv, lock, 0.02, [] { return false; }));  // slept it out
    CHECK(!sd::Stragglers::sleep(cv, lock, 3600, [] { return true; }));   // done at once
    // A signal handler cannot notify the condition variable: the flag is read in slices.
    REQUIRE(strata::stop_signal().load() == 0);
    const auto t0 = std::chrono::steady_clock::now();
    std::thread signaller([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        strata::stop_signal() = 2;  // what StopOnSignal's handler stores for SIGINT
    });
    const bool stopped = sd::Stragglers::sleep(cv, lock, 3600, [] { return false; });
    const auto took = std::chrono::steady_clock::now() - t0;
    signaller.join();
    strata::stop_signal() = 0;
    CHECK(stopped);
    CHECK(took < std::chrono::seconds(2));
}

namespace {

// An epoch as an admission rule sees it, which records the rule's moves as text.
struct ScriptedEpoch final : sd::detail::PsEpochMoves {
    int n = 4, open = 0, round = 4;
    bool virtual_ = false, more_updates = true;
    std::vector<int> waits, blocks;
    std::vector<std::int64_t> leads = std::vector<std::int64_t>(4, 0);
    std::int64_t gap = 0;
    std::string moves;
    int workers() const override { return n; }
    int pending() const override { return open; }
    int round_started() const override { return round; }
    bool virtual_clock() const override { return virtual_; }
    bool close() override {
        moves += "close ";
        open = 0;
        return more_updates;
    }
    void cancel_computing() override { moves += "cancel "; }
    void start_round() override { moves += "round "; }
    void dispatch(int w) override { moves += "dispatch" + std::to_string(w) + " "; }
    void wait(int w) override { waits.push_back(w); }
    bool waiting(int w) const override { return std::find(waits.begin(), waits.end(), w) != waits.end(); }
    void defer(int w) override { moves += "defer" + std::to_string(w) + " "; }
    void clear_deferred() override { moves += "undefer "; }
    std::int64_t lead(int w) const override { return leads[std::size_t(w)]; }
    void block(int w) override { moves += "block" + std::to_string(w) + " "; blocks.push_back(w); }
    bool blocked(int w) const override { return std::find(blocks.begin(), blocks.end(), w) != blocks.end(); }
    void idle(int w) override { moves += "idle" + std::to_string(w) + " "; }
    void record_ssp_gap(std::int64_t g) override { gap = std::max(gap, g); }
};

}  // namespace

TEST_CASE("admission: each sync mode's rule closes, cancels and restarts as sync.hpp's table says") {
    using sd::detail::make_admission;
    using R = strata::sync::Rule;
    SUBCASE("Synchronous: the round's last push closes the update, then a new round") {
        auto rule = make_admission(R::Synchronous, 0, -1);
        CHECK(rule->rounds());
        CHECK(rule->needs_every_worker());
        CHECK(rule->expected_updates(10, 4) == 3);
        ScriptedEpoch e;
        e.open = 3;
        CHECK(rule->admitted(2, e));
        CHECK(e.moves.empty());
        CHECK(e.waiting(2));
        e.open = 4;
        CHECK(rule->admitted(1, e));
        CHECK(e.moves == "cancel close round ");
        e.open = 4;
        e.more_updates = false;  // fit wants no more: no new round
        e.moves.clear();
        CHECK(!rule->admitted(0, e));
        CHECK(e.moves == "cancel close ");
    }
    SUBCASE("KSync<2>: the second push closes, the rest are cancelled; a short round needs fewer") {
        auto rule = make_admission(R::KSync, 2, -1);
        CHECK(rule->rounds());
        CHECK(!rule->needs_every_worker());
        ScriptedEpoch e;
        e.open = 1;
        CHECK(rule->admitted(3, e));
        CHECK(e.moves.empty());
        e.open = 2;
        CHECK(rule->admitted(0, e));
        CHECK(e.moves == "cancel close round ");
        e.moves.clear();
        e.round = 1;  // the data ran out after one dispatch
        e.open = 1;
        CHECK(rule->admitted(0, e));
        CHECK(e.moves == "cancel close round ");
    }
    SUBCASE("KBatchSync<2>: a push below K restarts the worker (deferred under the virtual clock)") {
        auto rule = make_admission(R::KBatchSync, 2, -1);
        CHECK(rule->expected_updates(10, 4) == -1);
        ScriptedEpoch e;
        e.open = 1;
        CHECK(rule->admitted(3, e));
        CHECK(e.moves == "dispatch3 ");
        e.virtual_ = true;
        e.moves.clear();
        CHECK(rule->admitted(1, e));
        CHECK(e.moves == "defer1 ");
        e.open = 2;
        e.moves.clear();
        CHECK(rule->admitted(2, e));
        CHECK(e.moves == "undefer cancel close round ");
    }
    SUBCASE("KAsync<2>: pushers wait; K pushes close and every waiting worker starts again") {
        auto rule = make_admission(R::KAsync, 2, -1);
        CHECK(!rule->rounds());
        CHECK(rule->expected_updates(9, 4) == 5);
        ScriptedEpoch e;
        e.open = 1;
        CHECK(rule->admitted(3, e));
        CHECK(e.moves.empty());
        e.open = 2;
        CHECK(rule->admitted(1, e));
        CHECK(e.moves == "close dispatch1 dispatch3 ");
    }
    SUBCASE("KBatchAsync<2>: the pusher goes on at once; every K-th push closes first") {
        auto rule = make_admission(R::KBatchAsync, 2, -1);
        ScriptedEpoch e;
        e.open = 1;
        CHECK(rule->admitted(2, e));
        CHECK(e.moves == "dispatch2 ");
        e.open = 2;
        e.moves.clear();
        CHECK(rule->admitted(0, e));
        CHECK(e.moves == "close dispatch0 ");
        e.open = 2;
        e.more_updates = false;
        e.moves.clear();
        CHECK(!rule->admitted(0, e));
        CHECK(e.moves == "close ");
    }
    SUBCASE("Asynchronous<1>: every push closes; a worker more than B ahead blocks until the slowest catches up") {
        auto rule = make_admission(R::Asynchronous, 1, 1);
        CHECK(rule->expected_updates(7, 4) == 7);
        ScriptedEpoch e;
        e.open = 1;
        e.leads = {2, 0, 1, 0};
        CHECK(rule->admitted(0, e));
        CHECK(e.moves == "close block0 block0 ");  // blocked, and still blocked when the blocked are tried again
        e.leads = {1, 0, 1, 0};  // the slowest finished one: worker 0 is within the bound again
        e.open = 1;
        e.moves.clear();
        CHECK(rule->admitted(2, e));
        CHECK(e.moves == "close idle2 dispatch2 idle0 dispatch0 ");
        rule->dispatched(0, e);
        CHECK(e.gap == 1);
        auto unbounded = make_admission(R::Asynchronous, 1, -1);
        e.leads = {100, 0, 0, 0};
        e.open = 1;
        e.blocks.clear();
        e.moves.clear();
        CHECK(unbounded->admitted(0, e));
        CHECK(e.moves == "close idle0 dispatch0 ");
    }
}

TEST_CASE("ps clock: the virtual clock's next event is the soonest finish, the lowest worker on a tie") {
    const auto st = sd::Stragglers::none();
    sd::detail::PsClock clock(true, st, 0, 0.5);
    CHECK(clock.is_virtual());
    CHECK(clock.begin_epoch(3) == 0.0);
    clock.start(1, 0);
    clock.start(2, 0);
    const auto computing = [](int v) { return v != 0; };
    CHECK(clock.soonest(3, computing) == 1);  // both finish at 0.5
    clock.advance_to(1);
    CHECK(clock.seconds() == 0.5);
    CHECK(clock.now() == 0.5);  // virtual: only the events move the time
    clock.start(1, 1);
    CHECK(clock.finish(1) == 1.0);
    CHECK(clock.soonest(3, computing) == 2);
    CHECK(clock.soonest(3, [](int) { return false; }) == -1);
    const auto slow = sd::Stragglers::slow(1, 3.0);
    sd::detail::PsClock real(false, slow, 0, 0.5);
    CHECK(!real.is_virtual());
    CHECK(real.delay(1, 0, 0.1) == doctest::Approx(0.2));  // factor 3: twice the measured time more
    CHECK(real.delay(0, 0, 0.1) == 0.0);
}
