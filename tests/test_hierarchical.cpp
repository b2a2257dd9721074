// The hierarchical transport of ProcessGroup (shared memory inside each host, MPI between one
// leader per host, broadcast back inside) and MultiWorkerMirrored over it, run by
// `mpirun -np 4` with STRATA_FAKE_HOSTS=2 (tests/meson.build): the 4 ranks are declared to be
// 2 hosts of 2 ranks, {0, 1} and {2, 3}, on this one machine.
#include <doctest/doctest.h>

#include "all_gather_check.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/multi_worker_mirrored.hpp>

using namespace strata::nn;
namespace dist = strata::distribute;
namespace coll = strata::distribute::collective;
using strata_test::lcg;
using strata_test::max_relative_difference;

namespace {

using Cnn = Sequential<Input<6, 6, 2>, Conv2D<3, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<5, Tanh>, Dense<3, Softmax>>;

int world_rank() { return coll::mpi::world_rank(); }
int world_size() { return coll::mpi::world_size(); }

strata::data::Dataset<> images(std::size_t n, std::uint64_t seed) {
    auto f64 = lcg(n * 72, seed, 0, 1);
    std::vector<float> f(f64.begin(), f64.end());
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((f[i * 72] + f[i * 72 + 7] > 1.0) + (f[i * 72 + 40] > 0.5));
    return strata::data::Dataset<>::from_arrays(std::move(f), {6, 6, 2}, std::move(y));
}

template <class T>
bool same_on_every_rank(std::vector<T> v) {
    auto root = v;
    MPI_Bcast(root.data(), int(root.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
    int same = std::memcmp(root.data(), v.data(), v.size() * sizeof(T)) == 0;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return same == 1;
}

template <class T, class Strategy>
std::vector<T> train(Strategy& s, strata::optim::Optimizer opt, const strata::data::Dataset<>& ds) {
    strata::Model<Cnn, Strategy, T> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(ds, {.epochs = 2, .verbose = 0});
    return model.get_weights();
}

// The layout these tests are written for.
bool two_by_two() {
    const char* v = std::getenv("STRATA_FAKE_HOSTS");
    return world_size() == 4 && v != nullptr && std::string(v) == "2";
}

}  // namespace

TEST_CASE("the fake host layout: 4 ranks, STRATA_FAKE_HOSTS=2, are 2 hosts of 2, and Auto picks the hierarchical transport") {
    REQUIRE(two_by_two());
    const int me = world_rank();
    coll::ProcessGroup pg(MPI_COMM_WORLD, 1);
    CHECK(pg.transport() == coll::Transport::Hierarchical);
    CHECK(pg.num_hosts() == 2);
    CHECK(pg.host_index() == me / 2);
    CHECK(pg.host_rank() == me % 2);
    CHECK(pg.local_size() == 4);  // the real host: cores and GPUs are shared among all 4
    // Asked explicitly, the shared-memory transport is refused: the ranks are not on one host.
    const auto msg = strata_test::error_of<strata::ValueError>(
        [] { coll::ProcessGroup shm(MPI_COMM_WORLD, 1, {.transport = coll::Transport::SharedMemory}); });
    CHECK(msg.find("the 4 ranks are on 2 hosts (STRATA_FAKE_HOSTS / fake_hosts)") != std::string::npos);
    // A layout that does not divide the ranks is refused on every rank.
    const auto bad = strata_test::error_of<strata::ValueError>([] { coll::ProcessGroup g(MPI_COMM_WORLD, 1, {.fake_hosts = 3}); });
    CHECK(bad.find("STRATA_FAKE_HOSTS=3 hosts must divide the 4 ranks evenly") != std::string::npos);
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("the host layout in words, and the layout a job expects (STRATA_EXPECT_HOSTS): refused on every rank with the layout found") {
    REQUIRE(two_by_two());
    {
        coll::ProcessGroup pg(MPI_COMM_WORLD, 1);
        CHECK(pg.host_layout() == "2 hosts (STRATA_FAKE_HOSTS): host 0 ranks 0-1, host 1 ranks 2-3");
    }
    for (const char* ok : {"2", "2x2", "any"}) {
        CAPTURE(ok);
        coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.expect_hosts = ok});
        CHECK(pg.num_hosts() == 2);
    }
    for (const char* wrong : {"1", "4", "2x1", "1x4", "3x2"}) {
        CAPTURE(wrong);
        const auto msg = strata_test::error_of<strata::ValueError>(
            [&] { coll::ProcessGroup g(MPI_COMM_WORLD, 1, {.expect_hosts = wrong}); });
        CHECK(msg.find("ProcessGroup: the job was expected on ") != std::string::npos);
        CHECK(msg.find("; found 2 hosts (STRATA_FAKE_HOSTS): host 0 ranks 0-1, host 1 ranks 2-3.") != std::string::npos);
    }
    for (const char* bad : {"2x", "x2", " 2", "2x2 ", "0", "2x0", "two"}) {
        CAPTURE(bad);
        const auto msg = strata_test::error_of<strata::ValueError>(
            [&] { coll::ProcessGroup g(MPI_COMM_WORLD, 1, {.expect_hosts = bad}); });
        CHECK(msg.find("expected H (hosts) or HxP (H hosts of P ranks each) in decimal digits") != std::string::npos);
    }
    // From the environment, as scripts/multihost passes it; a group of part of the job (here the
    // ranks of one host) checks no expectation: it is the whole job's.
    ::setenv("STRATA_EXPECT_HOSTS", "3", 1);
    const auto env = strata_test::error_of<strata::ValueError>([] { coll::ProcessGroup g(MPI_COMM_WORLD, 1); });
    CHECK(env.find("expected on 3 hosts (STRATA_EXPECT_HOSTS / expect_hosts=3); found 2 hosts") != std::string::npos);
    MPI_Comm half = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() / 2, world_rank(), &half);
    {
        coll::ProcessGroup part(half, 1, {.fake_hosts = 0});
        CHECK(part.num_hosts() == 1);
    }
    MPI_Comm_free(&half);
    ::unsetenv("STRATA_EXPECT_HOSTS");
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("hosts named by STRATA_HOST_NAME: the real layout from the names, in any order of ranks, hierarchical and exact") {
    REQUIRE(two_by_two());
    const int me = world_rank(), n = world_size();
    // Ranks 0 and 2 on host 'even', 1 and 3 on 'odd': hosts that do not hold consecutive ranks
    // (Open MPI's --map-by node). They are one machine, so they do share memory: accepted.
    ::setenv("STRATA_HOST_NAME", me % 2 == 0 ? "even" : "odd", 1);
    {
        coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.fake_hosts = 0, .expect_hosts = "2x2"});
        CHECK(pg.transport() == coll::Transport::Hierarchical);
        CHECK(pg.host_layout() == "2 hosts: 'even' ranks 0,2, 'odd' ranks 1,3");
        CHECK(pg.host_index() == me % 2);
        CHECK(pg.host_rank() == me / 2);
        std::vector<double> v(1001);
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(i) * (me + 1);
        pg.all_reduce(0, std::span<double>(v));
        bool ok = true;
        for (std::size_t i = 0; i < v.size(); ++i) ok = ok && v[i] == double(i) * (n * (n + 1) / 2);
        CHECK(ok);
        for (int root = 0; root < n; ++root) {
            std::vector<double> b(17, double(me));
            pg.broadcast(0, std::span<double>(b), root);
            CHECK(std::all_of(b.begin(), b.end(), [&](double x) { return x == double(root); }));
        }
        strata_test::check_all_gather(pg, 0);  // a host's parts are not one block of the buffer here
    }
    ::unsetenv("STRATA_HOST_NAME");
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("hierarchical all-reduce, broadcast and barrier: exact sums, the same bits on every rank, the cross-host stage counted") {
    REQUIRE(two_by_two());
    const int n = world_size(), me = world_rank();
    coll::ProcessGroup pg(MPI_COMM_WORLD, 2, {.transport = coll::Transport::Hierarchical, .chunk_bytes = 1024});
    for (std::size_t len : {std::size_t(0), std::size_t(1), std::size_t(5), std::size_t(1000), std::size_t(100003)}) {
        CAPTURE(len);
        std::vector<double> v(len);
        for (std::size_t i = 0; i < len; ++i) v[i] = double(i % 97) * (me + 1) + 0.5;
        pg.all_reduce(0, std::span<double>(v));
        bool ok = true;
        for (std::size_t i = 0; i < len; ++i) ok = ok && v[i] == double(i % 97) * (n * (n + 1) / 2) + 0.5 * n;
        CHECK(ok);
        std::vector<float> f(len, float(me + 1));
        pg.all_reduce(1, std::span<float>(f), coll::ReduceOp::Mean);
        CHECK(std::all_of(f.begin(), f.end(), [&](float x) { return x == float(n + 1) / 2; }));
        for (int root = 0; root < n; ++root) {  // a root on either host, leader or not
            std::vector<double> b(len, double(me));
            pg.broadcast(0, std::span<double>(b), root);
            CHECK(std::all_of(b.begin(), b.end(), [&](double x) { return x == double(root); }));
        }
    }
    // Values whose float sum depends on the order: every rank still holds the same bits.
    auto r64 = lcg(40000, 100 + std::uint64_t(me), -1, 1);
    std::vector<float> r(r64.begin(), r64.end());
    pg.all_reduce(0, std::span<float>(r));
    CHECK(same_on_every_rank(r));
    // Both lanes at once, from two threads.
    std::vector<float> a(30000, 1.0f), c(20000, 2.0f);
    std::thread other([&] { pg.all_reduce(1, std::span<float>(c)); });
    pg.all_reduce(0, std::span<float>(a));
    other.join();
    CHECK(a[29999] == float(n));
    CHECK(c[0] == float(2 * n));
    pg.barrier(0);
    const auto st = pg.cross_host_stats();
    if (pg.host_rank() == 0) {
        CHECK(st.calls > 0);
        // Every all-reduce above crossed once per call: 5 lengths × (8 + 4) bytes per element, and the rest.
        CHECK(st.bytes == std::int64_t((0 + 1 + 5 + 1000 + 100003) * 12 + 40000 * 4 + 30000 * 4 + 20000 * 4));
        CHECK(st.seconds > 0);
    } else {
        CHECK(st.calls == 0);
        CHECK(st.bytes == 0);
    }
}

TEST_CASE("hierarchical all-gather: every part bit for bit, on both lanes; each leader puts only its host's parts across") {
    REQUIRE(two_by_two());
    coll::ProcessGroup pg(MPI_COMM_WORLD, 2, {.transport = coll::Transport::Hierarchical, .chunk_bytes = 1024});
    strata_test::check_all_gather(pg, 0);
    strata_test::check_all_gather(pg, 1);
    const auto st = pg.cross_host_stats();
    if (pg.host_rank() == 0) {
        // Host h holds ranks 2h and 2h + 1. Per layout: a double and a float call on each lane.
        const int h = pg.host_index();
        std::int64_t bytes = 0, calls = 0;
        for (const auto& c : strata_test::all_gather_layouts(4)) {
            bytes += 2 * (c[std::size_t(2 * h)] + c[std::size_t(2 * h + 1)]) * std::int64_t(sizeof(double) + sizeof(float));
            calls += 4;
        }
        CHECK(st.calls == calls);
        CHECK(st.bytes == bytes);  // (a sum of the whole buffer would put all of it across)
    } else {
        CHECK(st.calls == 0);
    }
}

TEST_CASE("MultiWorkerMirrored over 2 fake hosts x 2 processes equals one device (and the flat transports)") {
    REQUIRE(two_by_two());
    const auto ds = images(46, 5).batch(10);  // 10 does not divide by 4 × 2 replicas; a partial last batch
    const strata::optim::Optimizer adam = strata::optim::Adam{.learning_rate = 0.01};
    dist::OneDevice<> one;
    const auto reference = train<double>(one, adam, ds);
    for (int replicas : {1, 2}) {
        CAPTURE(replicas);
        dist::MultiWorkerMirrored<> mw(replicas, {.bucket_bytes = 64}, {.transport = coll::Transport::Auto});
        CHECK(mw.process_group().transport() == coll::Transport::Hierarchical);
        const auto w = train<double>(mw, adam, ds);
        CHECK(max_relative_difference(w, reference) <= 1e-12);
        CHECK(same_on_every_rank(w));
        if (mw.process_group().host_rank() == 0) CHECK(mw.process_group().cross_host_stats().bytes > 0);
    }
    const strata::optim::Optimizer sgd = strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9};
    const auto ref32 = train<float>(one, sgd, ds);
    dist::MultiWorkerMirrored<> h(2, {}, {.transport = coll::Transport::Hierarchical});
    const auto w32 = train<float>(h, sgd, ds);
    CHECK(max_relative_difference(w32, ref32) <= 1e-6);
    CHECK(same_on_every_rank(w32));
}

TEST_CASE("hierarchical: hosts that pass other lengths get an error on every rank at once, naming both") {
    // Each host agrees inside itself; the leaders' stage between hosts finds the difference. Its
    // ShapeError reaches only the leaders: their hosts' ranks, waiting for them, are stopped with it.
    REQUIRE(two_by_two());
    const int me = world_rank();
    coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.timeout = std::chrono::seconds(20), .transport = coll::Transport::Hierarchical});
    pg.barrier(0);
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> v(me >= 2 ? 7 : 5, 1.0f);
    std::string msg;
    if (me == 0 || me == 2)
        msg = strata_test::error_of<strata::ShapeError>([&] { pg.all_reduce(0, std::span<float>(v)); });
    else
        msg = strata_test::error_of<strata::DistributedError>([&] { pg.all_reduce(0, std::span<float>(v)); });
    CAPTURE(msg);
    CHECK(msg.find("between hosts (their leaders): rank 2 passed 7 elements but rank 0 passed 5") != std::string::npos);
    if (me == 1 || me == 3)
        CHECK(msg.find("rank " + std::to_string(me - 1) + " of 4 failed: rank " + std::to_string(me - 1) + ": ") != std::string::npos);
    CHECK(pg.failed());
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));  // not the 20 s deadline
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("hierarchical all-gather: hosts that split the buffer otherwise are refused on every rank, even where their blocks agree") {
    // Host 0 splits 16 elements 3, 5, 4, 4, host 1 evenly: each host agrees inside itself and
    // both hosts' blocks are 8 elements, but rank 1's part is not what host 1 thinks it is.
    REQUIRE(two_by_two());
    const int me = world_rank();
    coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.timeout = std::chrono::seconds(20), .transport = coll::Transport::Hierarchical});
    std::vector<std::int64_t> counts{4, 4, 4, 4};
    if (me < 2) {
        counts[0] = 3;
        counts[1] = 5;
    }
    std::vector<float> v(16, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    std::string msg;
    if (me == 0 || me == 2)
        msg = strata_test::error_of<strata::ShapeError>(
            [&] { pg.all_gather(0, std::span<float>(v), std::span<const std::int64_t>(counts)); });
    else
        msg = strata_test::error_of<strata::DistributedError>(
            [&] { pg.all_gather(0, std::span<float>(v), std::span<const std::int64_t>(counts)); });
    CAPTURE(msg);
    CHECK(msg.find("between hosts (their leaders): rank 2 splits the 16 elements into other parts than rank 0") != std::string::npos);
    CHECK(pg.failed());
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("hierarchical: a rank that does not arrive is named by its host, and the job stops on every rank") {
    REQUIRE(two_by_two());
    const int me = world_rank();
    coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.timeout = std::chrono::milliseconds(500), .stall_warning = std::chrono::milliseconds(-1),
                                              .transport = coll::Transport::Hierarchical});
    pg.barrier(0);
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> v(1000, 1.0f);
    std::string msg;
    if (me == 3) std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // late: the others gave up
    msg = strata_test::error_of<strata::DistributedError>([&] { pg.all_reduce(0, std::span<float>(v)); });
    CAPTURE(msg);
    CHECK(!msg.empty());
    CHECK(pg.failed());
    if (me == 2)  // rank 3's host leader names it
        CHECK(msg.find("inside host 1: rank 3 of 4 did not arrive within 500 ms") != std::string::npos);
    if (me == 0)  // the other leader names the host's leader that did not come
        CHECK(msg.find("between hosts (their leaders): rank 2 of 4 did not arrive within 500 ms") != std::string::npos);
    if (me == 1)  // stopped by its leader's abort, which says why (it waits 3 timeouts for its leader)
        CHECK(msg.find("rank 0 of 4 failed: rank 0: across processes: all_reduce between hosts (their leaders): rank 2 of 4 "
                       "did not arrive within 500 ms") != std::string::npos);
    if (me != 3) CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(2500));
    MPI_Barrier(MPI_COMM_WORLD);
}
