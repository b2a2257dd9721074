// Distribution inside one process: every multi-replica strategy must train exactly like one
// device on the same global batches (also when the batch does not divide by the replicas), and
// failures must end promptly with the right error.
#include <doctest/doctest.h>

#include "test_images.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace strata::nn;
namespace dist = strata::distribute;

using strata_test::lcg;
using strata_test::max_relative_difference;

namespace {

using Cnn = Sequential<Input<6, 6, 2>, Conv2D<3, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<5, Tanh>, Dense<3, Softmax>>;


using strata_test::images;


template <class Strategy, class T>
std::vector<T> train_with(Strategy& s, strata::optim::Optimizer opt, int steps, std::size_t global_batch) {
    strata::Model<Cnn, Strategy, T> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(images(global_batch * std::size_t(steps), 5).batch(global_batch), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}

template <class T>
void check_strategies(strata::optim::Optimizer opt, double tolerance) {
    for (std::size_t global : {12u, 10u}) {  // 10 does not divide by 3 or 4
        dist::OneDevice<> one;
        const auto reference = train_with<dist::OneDevice<>, T>(one, opt, 4, global);
        for (int n = 1; n <= 4; ++n) {
            CAPTURE(n);
            CAPTURE(global);
            dist::Mirrored<> mirrored(n);
            CHECK(mirrored.num_replicas_in_sync() == n);
            CHECK(max_relative_difference(train_with<dist::Mirrored<>, T>(mirrored, opt, 4, global), reference) <= tolerance);
            // Small buckets: several all-reduces per step, overlapped with the backward pass.
            dist::Mirrored<> bucketed(n, {.bucket_bytes = 64});
            CHECK(max_relative_difference(train_with<dist::Mirrored<>, T>(bucketed, opt, 4, global), reference) <= tolerance);
            dist::Mirrored<> ring(n, {.all_reduce = dist::Algorithm::Ring});
            CHECK(max_relative_difference(train_with<dist::Mirrored<>, T>(ring, opt, 4, global), reference) <= tolerance);
            dist::CentralStorage<> central(n);
            CHECK(max_relative_difference(train_with<dist::CentralStorage<>, T>(central, opt, 4, global), reference) <= tolerance);
        }
    }
}

}  // namespace

TEST_CASE("replica slices cover each example of a global batch exactly once") {
    for (int n = 1; n <= 8; ++n)
        for (std::int64_t global : {0, 1, 7, 10, 128, 129}) {
            std::int64_t next = 0;
            for (int r = 0; r < n; ++r) {
                const auto sl = dist::replica_slice(global, n, r);
                CHECK(sl.first == next);
                CHECK(sl.count >= global / n);
                CHECK(sl.count <= global / n + 1);
                next += sl.count;
            }
            CHECK(next == global);
        }
}

TEST_CASE("Mirrored and CentralStorage equal OneDevice on the same global batches (float64, SGD momentum)") {
    check_strategies<double>(strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9}, 1e-12);
}

TEST_CASE("Mirrored and CentralStorage equal OneDevice on the same global batches (float64, RMSprop)") {
    check_strategies<double>(strata::optim::RMSprop{.learning_rate = 0.01}, 1e-12);
}

TEST_CASE("Mirrored and CentralStorage equal OneDevice on the same global batches (float32, SGD)") {
    check_strategies<float>(strata::optim::SGD{.learning_rate = 0.1}, 1e-6);
}

TEST_CASE("gradient buckets: whole layers, backward order, sized by bucket_bytes") {
    dist::Mirrored<> small(2, {.bucket_bytes = 64}), large(2), none(2, {.bucket_bytes = 0});
    strata::Model<Cnn, dist::Mirrored<>> a(small, 1), b(large, 1), c(none, 1);
    CHECK(a.gradient_buckets() == 3);  // conv2d, dense, dense_1: each over 64 bytes, one bucket each
    CHECK(b.gradient_buckets() == 1);
    CHECK(c.gradient_buckets() == 1);
}

TEST_CASE("Mirrored training is bitwise reproducible, and evaluate/predict match one device") {
    dist::Mirrored<> a(3), b(3);
    const auto wa = train_with<dist::Mirrored<>, float>(a, strata::optim::Adam{}, 3, 10);
    const auto wb = train_with<dist::Mirrored<>, float>(b, strata::optim::Adam{}, 3, 10);
    CHECK(wa == wb);

    dist::Mirrored<> m(3);
    strata::Model<Cnn, dist::Mirrored<>> mm(m, 3);
    strata::Model<Cnn> single(3);
    mm.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    single.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{});
    auto data = images(23, 8).batch(10);
    const auto e1 = mm.evaluate(data), e2 = single.evaluate(data);
    CHECK(e1.examples == 23);
    CHECK(e1.loss == doctest::Approx(e2.loss).epsilon(1e-6));
    CHECK(e1.accuracy == doctest::Approx(e2.accuracy));
    const auto p1 = mm.predict(data), p2 = single.predict(data);
    CHECK(p1.shape() == strata::Shape{23, 3});
    CHECK(max_relative_difference(strata::to_vector(p1.view()), strata::to_vector(p2.view())) < 1e-6);
}

TEST_CASE("a custom training loop with strategy.run and a distributed dataset equals fit") {
    dist::Mirrored<> s1(2), s2(2);
    strata::Model<Cnn, dist::Mirrored<>> by_fit(s1, 4), by_loop(s2, 4);
    for (auto* m : {&by_fit, &by_loop}) m->compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
    auto data = images(40, 6).batch(8);
    by_fit.fit(data, {.epochs = 1, .verbose = 0});

    auto distributed = dist::distribute_dataset(s2, data);
    double total_loss = 0;
    int steps = 0;
    for (auto it = distributed.iterate(0); it != std::default_sentinel; ++it) {
        const auto batch = *it;
        by_loop.begin_step();
        auto losses = s2.run([&](dist::ReplicaContext& ctx) {
            const double l = by_loop.compute_gradients(ctx, batch[ctx.replica_id_in_sync_group()]);
            by_loop.apply_gradients(ctx);
            return l;
        });
        CHECK(losses.size() == 2);
        total_loss += s2.reduce(dist::ReduceOp::Sum, losses) / double(batch.global_size());
        by_loop.end_step(batch.global_size());
        ++steps;
    }
    CHECK(steps == 5);
    CHECK(std::isfinite(total_loss));
    CHECK(by_loop.get_weights() == by_fit.get_weights());
}

TEST_CASE("a replica that throws stops the step; the error names it; nothing hangs") {
    dist::Mirrored<> s(4, {.timeout = std::chrono::seconds(30)});
    std::vector<float> buf(4 * 100, 1.0f);
    auto failing = [&](dist::ReplicaContext& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        if (r == 2) throw strata::ValueError("bad data in replica two");
        ctx.all_reduce(std::span<float>(buf.data() + r * 100, 100));
    };
    for (int attempt = 0; attempt < 2; ++attempt) {
        // The thrown replica's own error, promptly: were the others not released by its abort,
        // they would wait out the 30 s timeout (and the error might still name replica 2).
        const auto start = std::chrono::steady_clock::now();
        const auto msg = strata_test::error_of<strata::DistributedError>([&] { s.run(failing); });
        const auto took = std::chrono::steady_clock::now() - start;
        INFO(msg);
        CHECK(strata_test::has(msg, "replica 2 of 4 failed: bad data in replica two"));
        CHECK(!strata_test::has(msg, "did not arrive"));
        CHECK(took < std::chrono::seconds(30) / 10);  // a generous bound, far below the timeout
    }
    // The strategy is usable again afterwards.
    s.run([&](dist::ReplicaContext& ctx) { ctx.all_reduce(std::span<float>(buf.data() + ctx.replica_id_in_sync_group() * 100, 100)); });
    CHECK(buf[0] == 4.0f);
}

namespace {
/// Makes thread `index` of every pool built in its scope fail to start (the test seam).
struct FailThreadStart {
    explicit FailThreadStart(int index) { dist::detail::fail_thread_start_at() = index; }
    ~FailThreadStart() { dist::detail::fail_thread_start_at() = -1; }
};
}  // namespace

TEST_CASE("FunctionRef calls what it refers to; an empty one is false, and the pool refuses it") {
    int calls = 0;
    auto add = [&](int a, int b) { ++calls; return a + b; };
    strata::FunctionRef<int(int, int)> f(add);
    CHECK(bool(f));
    CHECK(f(2, 5) == 7);
    CHECK(f(-3, 1) == -2);
    CHECK(calls == 2);
    int (*none)(int, int) = nullptr;
    CHECK_FALSE(bool(strata::FunctionRef<int(int, int)>(none)));
    CHECK_FALSE(bool(strata::FunctionRef<int(int, int)>()));

    dist::ReplicaPool pool(3);
    std::vector<int> seen(3, 0);
    pool.run([&](int r) { seen[std::size_t(r)] = r + 10; });
    CHECK(seen == std::vector<int>{10, 11, 12});
    CHECK_THROWS_WITH_AS(pool.run(nullptr), doctest::Contains("no function to run on the replicas"), strata::ValueError);
    pool.run([&](int r) { seen[std::size_t(r)] = -r; });  // still usable after the refusal
    CHECK(seen == std::vector<int>{0, -1, -2});
}

TEST_CASE("a pool whose threads cannot all start stops those that did and says why") {
    std::atomic<int> set_up{0};
    {
        FailThreadStart fail(5);
        const auto msg = strata_test::error_of<strata::DistributedError>(
            [&] { dist::ReplicaPool pool(8, [&](int) { ++set_up; }); });
        INFO(msg);
        CHECK(strata_test::has(msg, "8 threads asked for, 5 started (now stopped)"));
        CHECK(strata_test::has(msg, "the system refused thread 5"));
        CHECK(strata_test::has(msg, std::strerror(EAGAIN)));
        CHECK(set_up == 5);  // the five that started ran, and were joined before the throw
    }
    {
        // Through the strategies, which start one thread per replica or worker.
        FailThreadStart fail(2);
        CHECK_THROWS_WITH_AS(dist::Mirrored<>(4), doctest::Contains("4 threads asked for, 2 started"), strata::DistributedError);
        CHECK_THROWS_WITH_AS((dist::ParameterServer<>(3, 1)), doctest::Contains("3 threads asked for, 2 started"),
                             strata::DistributedError);
    }
    dist::Mirrored<> fine(4);  // the seam is off again: the same counts start
    CHECK(fine.num_replicas_in_sync() == 4);
}

TEST_CASE("a pool that hits a real memory limit throws instead of hanging (a child process under RLIMIT_AS)") {
    // Root ignores RLIMIT_NPROC, but not RLIMIT_AS: with little address space left, glibc cannot
    // map the next thread's stack and pthread_create fails with EAGAIN. The child must end with
    // the pool's error; a pool that waited forever is killed by the alarm.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::alarm(30);
        long vm_kb = 0;
        if (FILE* f = std::fopen("/proc/self/status", "r")) {
            char line[256];
            while (std::fgets(line, sizeof line, f))
                if (std::sscanf(line, "VmSize: %ld kB", &vm_kb) == 1) break;
            std::fclose(f);
        }
        if (vm_kb <= 0) ::_exit(4);
        const rlim_t limit = rlim_t(vm_kb) * 1024 + (rlim_t(96) << 20);
        const struct rlimit rl{limit, limit};
        if (::setrlimit(RLIMIT_AS, &rl) != 0) ::_exit(5);
        try {
            dist::ReplicaPool pool(256);
            ::_exit(3);  // every thread started: the limit did not bite
        } catch (const strata::DistributedError& e) {
            const std::string msg = e.what();
            ::_exit(msg.find("256 threads asked for") != std::string::npos && msg.find("started (now stopped)") != std::string::npos
                        ? 0 : 6);
        } catch (...) {
            ::_exit(2);
        }
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    INFO("child ", WIFEXITED(status) ? "exited " + std::to_string(WEXITSTATUS(status)) : "killed by signal " + std::to_string(WTERMSIG(status)));
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
}

TEST_CASE("replica and worker counts the machine cannot run are refused, naming the count and the limit") {
    // 1024 replicas or 1000 workers on a few cores once started every thread and grew until the
    // kernel killed the process; 4 to 8 replicas on 2 cores are fine (the tests above run them).
    const int limit = dist::max_replica_threads();
    CHECK(limit >= 64);
    const std::string at_most = "at most " + std::to_string(limit);
    const std::string over = std::to_string(limit + 1);
    auto refused = [](auto&& make) { return strata_test::error_of<strata::ValueError>(make); };
    std::string msg = refused([&] { dist::Mirrored<> s(limit + 1); });
    INFO(msg);
    CHECK(strata_test::has(msg, "Mirrored: " + over + " replicas"));
    CHECK(strata_test::has(msg, at_most));
    msg = refused([&] { dist::CentralStorage<> s(limit + 1); });
    CHECK(strata_test::has(msg, over + " replicas"));
    CHECK(strata_test::has(msg, at_most));
    msg = refused([&] { dist::ParameterServer<> s(limit + 1, 1); });
    CHECK(strata_test::has(msg, over + " workers"));
    CHECK(strata_test::has(msg, at_most));
    msg = refused([&] { dist::ParameterServer<> s(2, limit + 1); });
    CHECK(strata_test::has(msg, over + " servers"));
    if (limit < 1000) {  // the cases, on a machine of fewer than 63 hardware threads
        CHECK(strata_test::has(refused([] { dist::ParameterServer<> s(1000, 1); }), "1000 workers"));
        CHECK(strata_test::has(refused([] { dist::Mirrored<> s(1024); }), "1024 replicas"));
    }
    dist::Mirrored<> eight(8);
    CHECK(eight.num_replicas_in_sync() == 8);
    // Memory: units that together need more than the physical memory are refused.
    const std::uint64_t physical = dist::physical_memory_bytes();
    REQUIRE(physical > 0);
    CHECK_THROWS_WITH_AS(dist::detail::check_units_fit_memory("ParameterServer", "workers", 4, physical / 2, "a copy"),
                         doctest::Contains("4 workers need at least"), strata::ValueError);
    CHECK_NOTHROW(dist::detail::check_units_fit_memory("ParameterServer", "workers", 4, physical / 8, "a copy"));
}

TEST_CASE("a collective that waits past its timeout names who did not arrive") {
    dist::Mirrored<> s(3, {.timeout = std::chrono::milliseconds(200)});
    std::vector<double> buf(3 * 8, 1.0);
    auto missing = [&](dist::ReplicaContext& ctx) {
        const int r = ctx.replica_id_in_sync_group();
        if (r == 1) return;  // never joins the all-reduce
        ctx.all_reduce(std::span<double>(buf.data() + r * 8, 8));
    };
    for (int attempt = 0; attempt < 2; ++attempt)  // the strategy is usable again after a timeout
        CHECK_THROWS_WITH_AS(s.run(missing), doctest::Contains("replica 1 of 3 did not arrive within 200 ms"),
                             strata::DistributedError);
}

TEST_CASE("the placement log names where each replica runs") {
    std::vector<std::string> lines;
    strata::place::set_placement_log_sink([&](std::string_view l) { lines.emplace_back(l); });
    strata::place::set_log_device_placement(true);
    {
        dist::Mirrored<> s(2);
        CHECK(s.devices().size() == 2);
        strata::Model<Cnn, dist::Mirrored<>> model(s, 1);
    }
    {
        dist::CentralStorage<> s(2);
        strata::Model<Cnn, dist::CentralStorage<>> model(s, 1);
    }
    strata::place::set_log_device_placement(false);
    strata::place::set_placement_log_sink({});
    REQUIRE(lines.size() >= 2);
    CHECK(lines[0].find("replica 0") != std::string::npos);
    CHECK(lines[1].find("/device:CPU:0/replica:1") != std::string::npos);
    auto has = [&](const std::string& a, const std::string& b) {
        return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
            return l.find(a) != std::string::npos && l.find(b) != std::string::npos;
        });
    };
    // Mirrored: a copy of every variable on every replica's device.
    CHECK(has("variable conv2d/kernel (3, 3, 2, 3) (copy 1)", "/device:CPU:0/replica:1"));
    CHECK(has("variable dense_1/bias (3,) (copy 0)", "/device:CPU:0/replica:0"));
    // CentralStorage: one copy, on the central device.
    CHECK(has("variable dense/kernel (12, 5) placed", "/device:CPU:0/replica:0"));
}

TEST_CASE("with Dropout, N replicas draw the masks one device draws for the same examples") {
    using Drop = Sequential<Input<6, 6, 2>, Flatten, Dense<16, ReLU>, Dropout<30>, Dense<3, Softmax>>;
    auto train = [](auto& strategy) {
        using S = std::remove_reference_t<decltype(strategy)>;
        strata::Model<Drop, S, double> model(strategy, 21);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
        model.fit(images(40, 3).batch(10), {.epochs = 2, .verbose = 0});
        return model.get_weights();
    };
    dist::OneDevice<> one;
    const auto reference = train(one);
    for (int n : {2, 3}) {
        dist::Mirrored<> m(n);
        CHECK(max_relative_difference(train(m), reference) <= 1e-12);
    }
}

TEST_CASE("replicas on configured logical devices keep their variables in those devices' memory") {
    namespace pl = strata::place;
    pl::reset_devices();
    const auto cpu = pl::list_physical_devices(pl::DeviceKind::Cpu).at(0);
    pl::set_logical_device_configuration(cpu, {{.cores = 1, .memory_limit = pl::Megabytes{64}},
                                               {.cores = 1, .memory_limit = pl::Megabytes{64}}},
                                         pl::Oversubscribe::Yes);
    {
        dist::Mirrored<> strategy(2);
        REQUIRE(strategy.devices().size() == 2);
        CHECK(strategy.devices()[1].name == "/device:CPU:1");
        strata::Model<Cnn, dist::Mirrored<>> model(strategy, 1);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
        const auto bytes = std::size_t(Cnn::num_params) * sizeof(float);
        // Parameters, gradients and Adam's two slots of replica 1 live on /device:CPU:1.
        CHECK(pl::memory_info(strategy.devices()[1]).current >= 4 * bytes);
        model.fit(images(20, 1).batch(10), {.epochs = 1, .verbose = 0});
        CHECK(pl::memory_info(strategy.devices()[0]).peak >= 4 * bytes);
    }
    pl::reset_devices();
}
