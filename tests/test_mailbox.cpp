// The pieces of a parameter server across processes that exist so far (issue 22): the layout of
// ranks (coordinator, servers, workers) and the point-to-point mailbox with deadlines, run by
// `mpirun -np 4` (tests/meson.build): 1 coordinator, 1 server and 2 workers.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <strata/distribute/collective/mailbox.hpp>
#include <strata/distribute/parameter_server_layout.hpp>

namespace coll = strata::distribute::collective;
using strata::distribute::ParameterServerLayout;

namespace {
int world_rank() { return coll::mpi::world_rank(); }
int world_size() { return coll::mpi::world_size(); }
}  // namespace

TEST_CASE("the layout of ranks: coordinator, servers, workers; a wrong count is refused naming both") {
    const auto l = ParameterServerLayout::of(6, /*workers=*/3, /*servers=*/2);
    CHECK(l.role(0) == ParameterServerLayout::Role::Coordinator);
    CHECK(l.role(1) == ParameterServerLayout::Role::Server);
    CHECK(l.role(2) == ParameterServerLayout::Role::Server);
    CHECK(l.role(3) == ParameterServerLayout::Role::Worker);
    CHECK(l.index(2) == 1);
    CHECK(l.index(5) == 2);
    CHECK(l.server_rank(1) == 2);
    CHECK(l.worker_rank(0) == 3);
    CHECK(l.name(0) == "coordinator (rank 0)");
    CHECK(l.name(4) == "worker 1 (rank 4)");
    const auto msg = strata_test::error_of<strata::ValueError>([] { (void)ParameterServerLayout::of(4, 3, 1); });
    CHECK(msg.find("1 coordinator, 1 server and 3 workers need 5 processes (mpirun -np 5), found 4") != std::string::npos);
    CHECK(!strata_test::error_of<strata::ValueError>([&] { (void)l.role(6); }).empty());
}

TEST_CASE("mailbox: messages arrive whole and in order between two ranks, large ones too") {
    REQUIRE(world_size() == 4);
    const int me = world_rank();
    const auto layout = ParameterServerLayout::of(world_size(), 2, 1);
    coll::Mailbox box(MPI_COMM_WORLD, std::chrono::seconds(30), [&](int r) { return layout.name(r); });
    if (me == 0) {
        for (int r = 1; r < 4; ++r) {
            std::vector<float> v(1000, float(r));
            box.send(r, 1, std::uint64_t(r), std::span<const float>(v));
        }
        for (int r = 1; r < 4; ++r)
            for (std::uint64_t step = 1; step <= 3; ++step) {
                const auto m = box.receive(r, "reply");
                CHECK(m.source == r);
                CHECK(m.kind == 2);
                CHECK(m.step == step);  // in the order sent
                const auto d = m.as<double>();
                REQUIRE(d.size() == (step == 3 ? std::size_t(2) << 20 : std::size_t(1000)));
                CHECK(d.front() == 2.0 * r + double(step));
                CHECK(d.back() == 2.0 * r + double(step));
            }
    } else {
        const auto m = box.receive(0, "request");
        CHECK(m.kind == 1);
        CHECK(m.step == std::uint64_t(me));
        const auto v = m.as<float>();
        REQUIRE(v.size() == 1000);
        for (std::uint64_t step = 1; step <= 3; ++step) {
            std::vector<double> d(step == 3 ? std::size_t(2) << 20 : v.size(), 2.0 * v[0] + double(step));  // 16 MiB last
            box.send(0, 2, step, std::span<const double>(d));
        }
    }
    CHECK(!strata_test::error_of<strata::ShapeError>([] {
              coll::Message m;
              m.payload.resize(6);
              (void)m.as<float>();
          }).empty());
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("mailbox: a rank that does not answer is named at the deadline, never a hang") {
    REQUIRE(world_size() == 4);
    const int me = world_rank();
    const auto layout = ParameterServerLayout::of(world_size(), 2, 1);
    coll::Mailbox box(MPI_COMM_WORLD, std::chrono::milliseconds(300), [&](int r) { return layout.name(r); });
    if (me == 0) {
        const auto start = std::chrono::steady_clock::now();
        const auto msg = strata_test::error_of<strata::DistributedError>([&] { (void)box.receive(3, "ParameterServer: push"); });
        CHECK(msg == "ParameterServer: push: worker 1 (rank 3) did not answer within 300 ms");
        CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(3));
        const auto late = box.receive(3, "late push", std::chrono::seconds(30));  // the late message still arrives
        CHECK(late.step == 9);
    } else if (me == 3) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        box.send(0, 3, 9);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}
