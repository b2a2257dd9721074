// Shared-memory collectives: correctness against a float64 reference, bitwise agreement across
// ranks and runs, and the failure paths (timeout, abort, mismatched arguments) that must turn
// into errors on every replica instead of hangs. No test asserts on timing.
#include <doctest/doctest.h>

#include <strata/distribute/collective/all_reduce.hpp>
#include <strata/distribute/collective/async.hpp>
#include <strata/distribute/rendezvous.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <csignal>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace coll = strata::distribute::collective;
using strata::DistributedError;
using strata::ShapeError;
using strata::distribute::Rendezvous;
using strata::distribute::SyncPoint;
using namespace std::chrono_literals;

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kSmall = true;  // ThreadSanitizer is ~10x slower: races show at small sizes too
#else
constexpr bool kSmall = false;
#endif

// Runs body(rank) on `n` threads; returns what each rank threw (null if nothing).
template <class Body>
std::vector<std::exception_ptr> run_replicas(int n, Body&& body) {
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
            try {
                body(r);
            } catch (...) {
                errors[static_cast<std::size_t>(r)] = std::current_exception();
            }
        });
    for (auto& t : threads) t.join();
    return errors;
}

// True once threads a and b have both been asleep (blocked in the kernel, as a condition
// variable wait is) at every look during 50 ms; false if that does not happen within 20 s.
// Read from /proc: the collective offers no hook to say who waits inside it.
bool both_blocked(pid_t a, pid_t b) {
    auto state = [](pid_t tid) {
        std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
        const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        const auto close = s.rfind(')');  // the thread's name, in parentheses, may hold spaces
        return close != std::string::npos && close + 2 < s.size() ? s[close + 2] : '?';
    };
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    auto asleep_since = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() < give_up) {
        const auto now = std::chrono::steady_clock::now();
        if (state(a) != 'S' || state(b) != 'S') asleep_since = now;
        else if (now - asleep_since >= std::chrono::milliseconds(50)) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
}

std::string message_of(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    }
}

template <class E>
bool is(const std::exception_ptr& e) {
    if (!e) return false;
    try {
        std::rethrow_exception(e);
    } catch (const E&) {
        return true;
    } catch (...) {
        return false;
    }
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// One pool of random inputs in (-1, 1); rank q's input of length len is pool[q*len, (q+1)*len).
const std::vector<double>& pool() {
    static const std::vector<double> values = [] {
        std::vector<double> v(8u << 20);
        std::mt19937_64 gen(20240611);
        std::uniform_real_distribution<double> dist(-1.0, 1.0);
        for (auto& x : v) x = dist(gen);
        return v;
    }();
    return values;
}

template <class T>
std::vector<std::vector<T>> inputs(int n, std::size_t len) {
    std::vector<std::vector<T>> in(static_cast<std::size_t>(n));
    const auto& p = pool();
    for (int q = 0; q < n; ++q) {
        auto& v = in[static_cast<std::size_t>(q)];
        v.resize(len);
        for (std::size_t i = 0; i < len; ++i) v[i] = static_cast<T>(p[q * len + i]);
    }
    return in;
}

// The float64 sum per element and the sum of magnitudes (the scale of the rounding error).
template <class T>
void reference(const std::vector<std::vector<T>>& in, std::vector<double>& sum,
               std::vector<double>& scale) {
    const std::size_t len = in.empty() ? 0 : in[0].size();
    sum.assign(len, 0.0);
    scale.assign(len, 0.0);
    for (const auto& v : in)
        for (std::size_t i = 0; i < len; ++i) {
            sum[i] += static_cast<double>(v[i]);
            scale[i] += std::abs(static_cast<double>(v[i]));
        }
}

template <class T>
std::vector<std::vector<T>> run_all_reduce(const std::vector<std::vector<T>>& in,
                                           coll::ReduceOp op, coll::Algorithm alg) {
    const int n = static_cast<int>(in.size());
    auto bufs = in;
    coll::ReplicaGroup group(n, {std::chrono::milliseconds(20000)});
    auto errors = run_replicas(n, [&](int r) {
        group.all_reduce(r, std::span<T>(bufs[static_cast<std::size_t>(r)]), op, alg);
    });
    for (int r = 0; r < n; ++r) {
        INFO("rank ", r);
        REQUIRE_MESSAGE(!errors[static_cast<std::size_t>(r)],
                        message_of(errors[static_cast<std::size_t>(r)]));
    }
    return bufs;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() &&
           (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Checks one (algorithm, N, length, op) against the reference, across ranks and across runs.
template <class T>
std::vector<T> check_all_reduce(coll::Algorithm alg, coll::ReduceOp op,
                      const std::vector<std::vector<T>>& in, const std::vector<double>& sum,
                      const std::vector<double>& scale) {
    const int n = static_cast<int>(in.size());
    const std::size_t len = in[0].size();
    INFO("algorithm ", coll::to_string(alg), ", op ", coll::to_string(op), ", N ", n,
         ", length ", len, ", ", std::is_same_v<T, float> ? "float" : "double");

    const auto first = run_all_reduce(in, op, alg);
    const auto second = run_all_reduce(in, op, alg);

    bool same_on_ranks = true;
    for (int r = 1; r < n; ++r)
        same_on_ranks = same_on_ranks && bitwise_equal(first[static_cast<std::size_t>(r)], first[0]);
    CHECK_MESSAGE(same_on_ranks, "results differ between ranks");
    CHECK_MESSAGE(bitwise_equal(first[0], second[0]), "results differ between two runs");

    // Recursive summation of N terms errs by at most (N-1) u sum|x| (u = eps/2), plus one
    // rounding for the Mean's division; the bound below has a margin of about 2.
    const double eps = std::is_same_v<T, float> ? std::numeric_limits<float>::epsilon() : 1e-12;
    const double divisor = op == coll::ReduceOp::Mean ? n : 1;
    std::size_t bad = 0, first_bad = 0;
    for (std::size_t i = 0; i < len; ++i) {
        const double want = sum[i] / divisor;
        const double tol = eps * (n * scale[i] / divisor + std::abs(want));
        if (!(std::abs(static_cast<double>(first[0][i]) - want) <= tol) && bad++ == 0) first_bad = i;
    }
    CHECK_MESSAGE(bad == 0, bad, " elements off the float64 reference, first at ", first_bad);
    return first[0];
}

template <class T>
void check_algorithms_for(int n, std::size_t len, bool with_mean) {
    const auto in = inputs<T>(n, len);
    std::vector<double> sum, scale;
    reference(in, sum, scale);
    for (auto op : {coll::ReduceOp::Sum, coll::ReduceOp::Mean}) {
        if (op == coll::ReduceOp::Mean && !with_mean) continue;
        const auto ring = check_all_reduce(coll::Algorithm::Ring, op, in, sum, scale);
        check_all_reduce(coll::Algorithm::NaiveRing, op, in, sum, scale);
        const auto direct = check_all_reduce(coll::Algorithm::Direct, op, in, sum, scale);
        // Both sum chunk c as x_c + x_{c+1} + ... + x_{c-1} (see direct.hpp).
        INFO("N ", n, ", length ", len, ", ", coll::to_string(op));
        CHECK_MESSAGE(bitwise_equal(ring, direct), "ring and direct differ");
    }
}

std::vector<std::size_t> test_sizes() {
    if (kSmall) return {0, 1, 2, 7, 13, 1009};
    return {0, 1, 2, 7, 13, 1009, std::size_t{1} << 20};
}

}  // namespace

TEST_CASE_TEMPLATE("all_reduce: every algorithm, N = 1..8, matches a float64 reference", T, float,
                   double) {
    const int max_n = kSmall ? 5 : 8;
    for (int n = 1; n <= max_n; ++n)
        for (std::size_t len : test_sizes())
            check_algorithms_for<T>(n, len, /*with_mean=*/len <= 1009 || n % 3 == 1);
}

TEST_CASE_TEMPLATE("all_reduce: a prime length near 1e6 for a few N", T, float, double) {
    if (kSmall) return;
    for (int n : {3, 7}) check_algorithms_for<T>(n, 999983, /*with_mean=*/n == 3);
}

TEST_CASE("all_reduce: Auto is Direct in shared memory and gives its bits") {
    CHECK(coll::ReplicaGroup::resolve(coll::Algorithm::Auto) == coll::Algorithm::Direct);
    const auto in = inputs<float>(5, 1009);
    const auto a = run_all_reduce(in, coll::ReduceOp::Mean, coll::Algorithm::Auto);
    const auto d = run_all_reduce(in, coll::ReduceOp::Mean, coll::Algorithm::Direct);
    CHECK(bitwise_equal(a[0], d[0]));
}

TEST_CASE("all_reduce: Mean of equal values is exact, N = 1 is a no-op") {
    for (int n = 1; n <= 8; ++n) {
        std::vector<std::vector<double>> in(static_cast<std::size_t>(n), std::vector<double>(37, 0.3));
        for (auto alg : {coll::Algorithm::Ring, coll::Algorithm::NaiveRing, coll::Algorithm::Direct}) {
            const auto out = run_all_reduce(in, coll::ReduceOp::Mean, alg);
            bool exact = true;
            for (const auto& v : out)
                for (double x : v) exact = exact && std::abs(x - 0.3) <= 4e-16;
            INFO("N ", n, ", ", coll::to_string(alg));
            CHECK(exact);
        }
    }
    std::vector<std::vector<float>> one{{1.5f, -2.0f}};
    CHECK(run_all_reduce(one, coll::ReduceOp::Sum, coll::Algorithm::Ring)[0] ==
          std::vector<float>{1.5f, -2.0f});
}

TEST_CASE("all_reduce: many calls in a row on one group") {
    const int n = 4;
    coll::ReplicaGroup group(n);
    std::vector<std::vector<double>> bufs(n, std::vector<double>(101));
    auto errors = run_replicas(n, [&](int r) {
        auto& b = bufs[static_cast<std::size_t>(r)];
        for (int it = 0; it < 60; ++it) {
            for (std::size_t i = 0; i < b.size(); ++i) b[i] = r + it + static_cast<double>(i);
            const auto alg = static_cast<coll::Algorithm>(it % 4);
            group.all_reduce(r, std::span<double>(b), coll::ReduceOp::Sum, alg);
            for (std::size_t i = 0; i < b.size(); ++i)
                if (b[i] != 6 + 4 * (it + static_cast<double>(i)))
                    throw std::runtime_error("wrong sum at call " + std::to_string(it));
        }
    });
    for (auto& e : errors) CHECK_MESSAGE(!e, message_of(e));
}

TEST_CASE("broadcast and barrier") {
    const int n = 5;
    coll::ReplicaGroup group(n);
    std::vector<std::vector<float>> bufs(n);
    for (int r = 0; r < n; ++r) bufs[r].assign(1000, static_cast<float>(r));
    auto errors = run_replicas(n, [&](int r) {
        group.barrier(r);
        group.broadcast(r, std::span<float>(bufs[static_cast<std::size_t>(r)]), 3);
        group.barrier(r);
    });
    for (auto& e : errors) CHECK_MESSAGE(!e, message_of(e));
    for (auto& b : bufs) CHECK(b == std::vector<float>(1000, 3.0f));
}

TEST_CASE("timeout: the waiting replicas are told exactly who did not arrive") {
    coll::ReplicaGroup group(3, {100ms});
    std::vector<std::vector<float>> bufs(3, std::vector<float>(64, 1.0f));
    auto errors = run_replicas(3, [&](int r) {
        if (r == 2) return;  // never calls
        group.all_reduce(r, std::span<float>(bufs[static_cast<std::size_t>(r)]),
                         coll::ReduceOp::Sum, coll::Algorithm::Ring);
    });
    for (int r : {0, 1}) {
        REQUIRE(is<DistributedError>(errors[r]));
        const auto msg = message_of(errors[r]);
        INFO(msg);
        CHECK(contains(msg, "all_reduce (ring, start)"));
        CHECK(contains(msg, "replica 2 of 3 did not arrive within 100 ms"));
    }
    CHECK(!errors[2]);
    CHECK(group.aborted());

    // A late replica is refused at once, with the same story.
    auto late = run_replicas(1, [&](int) { group.all_reduce(2, std::span<float>(bufs[2])); });
    REQUIRE(is<DistributedError>(late[0]));
    CHECK(contains(message_of(late[0]), "replica 2 of 3 did not arrive"));

    // After reset() the group works again.
    group.reset();
    errors = run_replicas(3, [&](int r) {
        group.all_reduce(r, std::span<float>(bufs[static_cast<std::size_t>(r)]));
    });
    for (auto& e : errors) CHECK_MESSAGE(!e, message_of(e));
    CHECK(bufs[0][0] == 3.0f);
}

TEST_CASE("rendezvous: a timeout names the step and every missing rank") {
    Rendezvous rv(4, 100ms);
    auto errors = run_replicas(2, [&](int r) {
        rv.arrive_and_wait(r, SyncPoint{"all_reduce", "ring", 3, 6});
    });
    for (auto& e : errors) {
        REQUIRE(is<DistributedError>(e));
        CHECK(message_of(e) ==
              "all_reduce (ring, step 3 of 6): replicas 2, 3 of 4 did not arrive within 100 ms");
    }
    CHECK(rv.failed_rank() == -1);
}

TEST_CASE("rendezvous: reusable over many generations, bad ranks refused") {
    Rendezvous rv(3, 10s);
    std::atomic<int> passed{0};
    auto errors = run_replicas(3, [&](int r) {
        for (int i = 0; i < 200; ++i) rv.arrive_and_wait(r, "loop");
        passed += 1;
    });
    for (auto& e : errors) CHECK_MESSAGE(!e, message_of(e));
    CHECK(passed == 3);
    CHECK_THROWS_AS(rv.arrive_and_wait(3, "x"), strata::ValueError);
    CHECK_THROWS_AS(Rendezvous(0, 1s), strata::ValueError);
    CHECK_THROWS_AS(Rendezvous(2, 0ms), strata::ValueError);
}

TEST_CASE("abort: a replica that throws releases the others with its name and message") {
    const int n = 4;
    coll::ReplicaGroup group(n, {std::chrono::milliseconds(30000)});
    std::vector<std::vector<double>> bufs(n, std::vector<double>(1000, 1.0));
    auto errors = run_replicas(n, [&](int r) {
        try {
            for (int it = 0; it < 5; ++it) {
                if (r == 1 && it == 3) throw std::runtime_error("loss is NaN");
                group.all_reduce(r, std::span<double>(bufs[static_cast<std::size_t>(r)]),
                                 coll::ReduceOp::Mean, coll::Algorithm::Ring);
            }
        } catch (...) {
            group.abort(r, std::current_exception());
            throw;
        }
    });
    CHECK(message_of(errors[1]) == "loss is NaN");
    for (int r : {0, 2, 3}) {
        REQUIRE(is<DistributedError>(errors[r]));
        INFO(message_of(errors[r]));
        CHECK(contains(message_of(errors[r]), "replica 1 failed: loss is NaN"));
    }
    CHECK(group.aborted());
    CHECK(message_of(group.failure()) == "loss is NaN");
    CHECK_THROWS_WITH_AS(group.barrier(0), doctest::Contains("replica 1 failed"), DistributedError);
    group.reset();
    CHECK(!group.aborted());
}

TEST_CASE("abort: replicas blocked inside a ring all-reduce are released at once with the failure") {
    // Ranks 1 and 2 enter a ring all-reduce and block in it (rank 0 never comes); only once
    // the kernel shows both threads asleep does rank 0 abort. They must be released promptly:
    // were the abort not to wake them, they would sleep until the 30 s timeout.
    const auto timeout = std::chrono::milliseconds(30000);
    coll::ReplicaGroup group(3, {timeout});
    std::vector<std::vector<float>> bufs(3, std::vector<float>(10, 1.0f));
    std::atomic<int> entered{0};
    std::vector<std::atomic<pid_t>> tids(3);
    std::vector<std::chrono::steady_clock::time_point> released(3);
    std::chrono::steady_clock::time_point aborted_at;
    auto errors = run_replicas(3, [&](int r) {
        if (r == 0) {
            while (entered.load() < 2) std::this_thread::yield();
            REQUIRE(both_blocked(tids[1].load(), tids[2].load()));
            aborted_at = std::chrono::steady_clock::now();
            group.abort(0, "out of memory on logical device 0");
            return;
        }
        tids[static_cast<std::size_t>(r)] = static_cast<pid_t>(::gettid());
        entered += 1;
        try {
            group.all_reduce(r, std::span<float>(bufs[static_cast<std::size_t>(r)]), coll::ReduceOp::Sum,
                             coll::Algorithm::Ring);
        } catch (...) {
            released[static_cast<std::size_t>(r)] = std::chrono::steady_clock::now();
            throw;
        }
    });
    for (int r : {1, 2}) {
        REQUIRE(is<DistributedError>(errors[r]));
        INFO(message_of(errors[r]));
        CHECK(contains(message_of(errors[r]), "all_reduce (ring, start): replica 0 failed: out of memory on logical device 0"));
        // A generous bound: well under the timeout, however loaded the machine.
        CHECK(released[static_cast<std::size_t>(r)] - aborted_at < timeout / 10);
    }
}

TEST_CASE("mismatched arguments are an error on every rank, and the group stays usable") {
    const int n = 3;
    coll::ReplicaGroup group(n, {std::chrono::milliseconds(30000)});
    std::vector<std::vector<float>> bufs(n, std::vector<float>(13, 1.0f));

    SUBCASE("length") {
        auto errors = run_replicas(n, [&](int r) {
            auto s = std::span<float>(bufs[static_cast<std::size_t>(r)]);
            group.all_reduce(r, r == 1 ? s.first(7) : s, coll::ReduceOp::Sum,
                             coll::Algorithm::Ring);
        });
        for (auto& e : errors) {
            REQUIRE(is<ShapeError>(e));
            CHECK(contains(message_of(e), "replica 1 passed 7 elements but replica 0 passed 13"));
        }
    }
    SUBCASE("op") {
        auto errors = run_replicas(n, [&](int r) {
            group.all_reduce(r, std::span<float>(bufs[static_cast<std::size_t>(r)]),
                             r == 2 ? coll::ReduceOp::Mean : coll::ReduceOp::Sum);
        });
        for (auto& e : errors) {
            REQUIRE(is<DistributedError>(e));
            CHECK(contains(message_of(e), "replica 2 asked for mean"));
        }
    }
    SUBCASE("collective") {
        auto errors = run_replicas(n, [&](int r) {
            if (r == 0)
                group.barrier(r);
            else
                group.all_reduce(r, std::span<float>(bufs[static_cast<std::size_t>(r)]));
        });
        for (auto& e : errors) {
            REQUIRE(is<DistributedError>(e));
            CHECK(contains(message_of(e), "same collectives in the same order"));
        }
    }
    SUBCASE("broadcast root") {
        auto errors = run_replicas(n, [&](int r) {
            group.broadcast(r, std::span<float>(bufs[static_cast<std::size_t>(r)]), r == 1 ? 2 : 0);
        });
        for (auto& e : errors) {
            REQUIRE(is<DistributedError>(e));
            CHECK(contains(message_of(e), "replica 1 passed root 2 but replica 0 root 0"));
        }
    }
    SUBCASE("shared buffer") {
        auto errors = run_replicas(n, [&](int r) {
            group.all_reduce(r, std::span<float>(bufs[r == 2 ? 1 : static_cast<std::size_t>(r)]));
        });
        for (auto& e : errors) {
            REQUIRE(is<DistributedError>(e));
            CHECK(contains(message_of(e), "replicas 1 and 2 passed overlapping buffers"));
        }
    }
    CHECK(!group.aborted());
    auto errors = run_replicas(n, [&](int r) {
        group.all_reduce(r, std::span<float>(bufs[static_cast<std::size_t>(r)]));
    });
    for (auto& e : errors) CHECK_MESSAGE(!e, message_of(e));
    CHECK(bufs[2][12] == 3.0f);
}

TEST_CASE("BucketPlan: contiguous buckets of whole tensors") {
    const std::vector<std::size_t> sizes{3, 5, 2, 10, 0, 1};
    coll::BucketPlan plan(sizes, sizeof(float), 8 * sizeof(float));
    REQUIRE(plan.size() == 4);
    CHECK(plan.total_length() == 21);
    const auto& b = plan.buckets();
    CHECK((b[0].first_tensor == 0 && b[0].tensor_count == 2 && b[0].offset == 0 && b[0].length == 8));
    CHECK((b[1].first_tensor == 2 && b[1].tensor_count == 1 && b[1].offset == 8 && b[1].length == 2));
    CHECK((b[2].first_tensor == 3 && b[2].tensor_count == 2 && b[2].offset == 10 && b[2].length == 10));
    CHECK((b[3].first_tensor == 5 && b[3].tensor_count == 1 && b[3].offset == 20 && b[3].length == 1));
    CHECK(plan.tensor_offset(4) == 20);
    CHECK(plan.bucket_of(4) == 2);
    std::vector<float> flat(21);
    CHECK(plan.slice(std::span<float>(flat), 2).data() == flat.data() + 10);
    std::vector<float> wrong(20);
    CHECK_THROWS_AS((void)plan.slice(std::span<float>(wrong), 0), ShapeError);
    CHECK(coll::BucketPlan({}, 4).size() == 0);
    CHECK(coll::BucketPlan({100}, 4).size() == 1);
    CHECK(coll::BucketPlan::default_bucket_bytes == (4u << 20));
}

TEST_CASE("AsyncAllReduce: buckets reduced while the caller computes") {
    const int n = 3;
    const std::vector<std::size_t> sizes{1000, 17, 4096, 1, 300, 2500};
    coll::BucketPlan plan(sizes, sizeof(double), 2048 * sizeof(double));
    REQUIRE(plan.size() > 2);
    coll::ReplicaGroup group(n, {std::chrono::milliseconds(30000)});
    std::vector<std::vector<double>> flat(n, std::vector<double>(plan.total_length()));
    auto errors = run_replicas(n, [&](int r) {
        auto& g = flat[static_cast<std::size_t>(r)];
        coll::AsyncAllReduce comm(group, r, coll::ReduceOp::Sum, coll::Algorithm::Ring);
        for (int step = 0; step < 3; ++step) {
            for (std::size_t b = 0; b < plan.size(); ++b) {
                const auto& k = plan.bucket(b);
                for (std::size_t i = k.offset; i < k.offset + k.length; ++i)
                    g[i] = (r + 1) * 0.5 + static_cast<double>(i) + step;  // "backward"
                comm.submit(b, plan.slice(std::span<double>(g), b));
            }
            comm.wait();
            for (std::size_t i = 0; i < g.size(); ++i)
                if (g[i] != 3.0 + 3 * (static_cast<double>(i) + step))
                    throw std::runtime_error("bucket element " + std::to_string(i) + " wrong");
        }
        CHECK(comm.pending() == 0);
    });
    for (auto& e : errors) CHECK_MESSAGE(!e, message_of(e));
}

TEST_CASE("AsyncAllReduce: a bad bucket is an error on every rank's wait()") {
    const int n = 3;
    coll::ReplicaGroup group(n, {std::chrono::milliseconds(30000)});
    // Distinct values per replica, so that a bucket left alone cannot pass for a reduced one.
    std::vector<std::vector<float>> flat;
    for (int r = 0; r < n; ++r) flat.emplace_back(100, float(r + 1));
    auto errors = run_replicas(n, [&](int r) {
        auto s = std::span<float>(flat[static_cast<std::size_t>(r)]);
        coll::AsyncAllReduce comm(group, r);
        comm.submit(0, s.first(40));
        comm.submit(1, r == 2 ? s.subspan(40, 10) : s.subspan(40, 30));
        comm.submit(2, s.subspan(70));
        comm.wait();
    });
    for (auto& e : errors) {
        REQUIRE(is<ShapeError>(e));
        CHECK(contains(message_of(e), "all_reduce (direct, bucket 1, start): replica 2 passed 10"));
    }
    // Bucket 0 was reduced on every rank before bucket 1 failed: the mean of 1, 2, 3.
    for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < 40; ++i) CHECK(flat[static_cast<std::size_t>(r)][i] == 2.0f);
}

TEST_CASE("AsyncAllReduce: a replica that fails while computing releases the others") {
    const int n = 3;
    coll::ReplicaGroup group(n, {std::chrono::milliseconds(30000)});
    std::vector<std::vector<float>> flat(n, std::vector<float>(300, 1.0f));
    auto errors = run_replicas(n, [&](int r) {
        auto s = std::span<float>(flat[static_cast<std::size_t>(r)]);
        coll::AsyncAllReduce comm(group, r);
        try {
            for (std::size_t b = 0; b < 3; ++b) {
                if (r == 1 && b == 1) throw std::runtime_error("bad batch");
                comm.submit(b, s.subspan(100 * b, 100));
            }
            comm.wait();
        } catch (...) {
            group.abort(r, std::current_exception());
            throw;
        }
    });
    CHECK(message_of(errors[1]) == "bad batch");
    for (int r : {0, 2}) {
        REQUIRE(is<DistributedError>(errors[r]));
        CHECK(contains(message_of(errors[r]), "replica 1 failed: bad batch"));
    }
}

TEST_CASE("AsyncAllReduce: destroyed with buckets pending, it aborts instead of hanging") {
    coll::ReplicaGroup group(2, {std::chrono::milliseconds(30000)});
    std::vector<float> a(10, 1.0f);
    {
        coll::AsyncAllReduce comm(group, 0);
        comm.submit(0, std::span<float>(a));  // rank 1 never comes
    }
    CHECK(group.aborted());
    CHECK(contains(message_of(group.failure()), "replica 0 destroyed its AsyncAllReduce"));
}

TEST_CASE("AsyncAllReduce: a replica that never submits times the others out") {
    coll::ReplicaGroup group(3, {100ms});
    std::vector<std::vector<double>> flat(3, std::vector<double>(50, 1.0));
    auto errors = run_replicas(3, [&](int r) {
        if (r == 2) return;
        coll::AsyncAllReduce comm(group, r, coll::ReduceOp::Sum);
        comm.submit(0, std::span<double>(flat[static_cast<std::size_t>(r)]));
        comm.wait();
    });
    for (int r : {0, 1}) {
        REQUIRE(is<DistributedError>(errors[r]));
        INFO(message_of(errors[r]));
        CHECK(contains(message_of(errors[r]), "all_reduce (direct, bucket 0, start)"));
        CHECK(contains(message_of(errors[r]), "replica 2 of 3 did not arrive within 100 ms"));
    }
}

TEST_CASE("RunningDeadline counts the time the process could run, not a suspension") {
    using strata::distribute::RunningDeadline;
    using clock = RunningDeadline::clock;
    const auto t0 = clock::time_point{} + 1h;
    RunningDeadline d(400ms, 1ms, t0);
    auto t = t0;
    for (int i = 0; i < 300; ++i) CHECK_FALSE(d.expired(t += 1ms));  // 300 ms of polling
    // Stopped for 10 s (SIGSTOP, Ctrl-Z), resumed: one poll's worth is counted, not 10 s.
    CHECK_FALSE(d.expired(t += 10s));
    CHECK(d.waited() == 301ms);
    CHECK(d.suspended() == 10s - 1ms);
    for (int i = 0; i < 99; ++i) CHECK_FALSE(d.expired(t += 1ms));
    CHECK(d.expired(t += 1ms));  // 401 ms counted: the deadline passes while running
    // A late poll within the grace (a quarter of the timeout, 50 ms to 1 s) is counted in full:
    // a loaded machine is not a suspension.
    RunningDeadline e(400ms, 1ms, t0);
    CHECK_FALSE(e.expired(t0 + 90ms));
    CHECK(e.waited() == 90ms);
    CHECK(e.suspended() == 0ms);
    // The grace scales with the timeout: 50 ms at least, 1 s at most.
    RunningDeadline f(60s, 1ms, t0);
    CHECK_FALSE(f.expired(t0 + 900ms));
    CHECK(f.suspended() == 0ms);
    CHECK_FALSE(f.expired(t0 + 900ms + 2s));
    CHECK(f.suspended() == 2s - 1ms);
}

TEST_CASE("Rendezvous: a process stopped (SIGSTOP) past the timeout and resumed does not time out") {
    // A child process: replica 1 arrives after 60 naps of 10 ms; replica 0 waits with a timeout of
    // 1500 ms. The parent stops the child for 3 s at about 100 ms, then resumes it: replica 1
    // still has most of its naps to take, so a deadline that counted the stop would fire first.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        int rc = 0;
        try {
            Rendezvous rv(2, 1500ms);
            std::thread late([&] {
                for (int i = 0; i < 60; ++i) std::this_thread::sleep_for(10ms);
                try {
                    rv.arrive_and_wait(1, SyncPoint{"barrier"});
                } catch (const DistributedError&) {  // the other's false timeout aborted the group
                }
            });
            try {
                rv.arrive_and_wait(0, SyncPoint{"barrier"});
            } catch (const DistributedError&) {
                rc = 3;  // the false timeout
            }
            late.join();
        } catch (...) {
            rc = rc ? rc : 4;
        }
        ::_exit(rc);
    }
    std::this_thread::sleep_for(100ms);
    ::kill(child, SIGSTOP);
    std::this_thread::sleep_for(3s);
    ::kill(child, SIGCONT);
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 300 && done == 0; ++i) {  // at most 30 s
        done = ::waitpid(child, &status, WNOHANG);
        if (done == 0) std::this_thread::sleep_for(100ms);
    }
    if (done == 0) {
        ::kill(child, SIGKILL);
        ::waitpid(child, &status, 0);
    }
    REQUIRE(done == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}
