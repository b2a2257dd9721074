// A pipeline across 4 processes (one stage each) whose stage 2 exits mid-training (std::_Exit,
// no MPI_Finalize): every other rank's fit throws DistributedError naming its rank (and, where
// they miss it inside a step, its stage and the micro-batch), within the deadline (the timeout times the stages on the waiting side), and
// nothing hangs. The same for pipeline × tensor (2 stages of 2 shards) losing one shard of a
// stage inside a step: every rank names it by its job rank. One case per job (-tc=...). Run by `mpirun --enable-recovery -np 4` (tests/meson.build): without it Open MPI
// ends the whole job as soon as a process exits without finalizing, and strata's handling would
// not be what is tested. Its own main: the ranks left end without MPI_Finalize (one is gone).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tensor_parallel_nets.hpp"
#include "test_util.hpp"

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>
#include <strata/distribute/pipeline_mpi.hpp>
#include <strata/distribute/tensor_parallel_mpi.hpp>

using namespace strata::nn;
namespace sd = strata::distribute;
namespace coll = strata::distribute::collective;

namespace {

using Net = Sequential<Input<8>, Dense<12, Tanh>, Dense<10, Tanh>, Dense<6, ReLU>, Dense<3, Softmax>>;

// Rank `victim` leaves the job after step `after` (every rank is done with that step): the
// pipeline stops in step after + 1.
struct ExitAfter : strata::train::Callback {
    int victim;
    std::int64_t after;
    ExitAfter(int v, std::int64_t a) : victim(v), after(a) {}
    void on_train_batch_end(strata::train::TrainingContext&, std::int64_t step, const strata::train::Logs&) override {
        if (step == after && coll::mpi::world_rank() == victim) std::_Exit(0);
    }
};

}  // namespace

TEST_CASE("a stage that exits mid-pipeline is named by every other rank within the deadline") {
    REQUIRE(coll::mpi::world_size() == 4);
    using S = sd::Pipeline<strata::place::Host, sd::OneFOneB, sd::split::Balanced<4>>;
    const auto timeout = std::chrono::milliseconds(1500);
    S pipeline({.micro_batches = 4, .timeout = timeout, .processes = sd::pipeline_processes()});
    strata::Model<Net, S> model(pipeline, 3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    auto f = strata_test::lcg(400 * 8, 5, 0, 1);
    auto data = strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {8}, std::vector<std::int32_t>(400, 1));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = strata_test::error_of<strata::DistributedError>([&] {
        model.fit(data.batch(8), {.epochs = 1, .callbacks = {std::make_shared<ExitAfter>(2, 2)}, .verbose = 0});
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(e);
    // Where the others notice depends on where they wait: since every rank agrees at each
    // step's end whether to stop (distribute/stop_agreement.hpp), a stage that leaves after its
    // step callbacks is missed by that agreement, naming its rank (on some ranks as the reason a
    // neighbour gave up); one that leaves inside a step
    // by the pipeline's own messages, naming its stage and the micro-batch.
    const bool at_agreement = strata_test::has(e, "(the stop request (fit)): ") &&
                              strata_test::has(e, "rank 2 of 4 did not arrive within");
    const bool in_step = strata_test::has(e, "stage 2 (rank 2) did not answer within") &&
                         strata_test::has(e, "micro-batch 0 of step 3");
    CHECK((at_agreement || in_step));
    // The longest wait: stage 3 for the activations from stages 0 to 2 (3 timeouts); plus the
    // three steps before, and a margin for a loaded machine.
    CHECK(seconds < 3 * 1.5 + 10);
}

TEST_CASE("pipeline x tensor: a shard of a stage that exits mid-training is named by every other rank within the deadline") {
    // 2 stages (one encoder block each) of 2 shards: ranks {0, 1} stage 0, {2, 3} stage 1; shard
    // j's pipeline is ranks j and 2 + j. Rank 3 (stage 1, shard 1) leaves after step 2: its
    // partner in the stage waits in a sum of their stage, its pipeline's stage 0 (rank 1) for its
    // messages, rank 0 for its own stage 1 (rank 2, which fails) or at the step's stop agreement.
    REQUIRE(coll::mpi::world_size() == 4);
    const auto timeout = std::chrono::milliseconds(1500);
    auto layout = sd::tensor_parallel_replicas(2, {.timeout = timeout});
    using S = sd::Pipeline<strata::place::Host, sd::OneFOneB, sd::split::At<2>>;
    S pipeline({.micro_batches = 4, .timeout = timeout, .processes = sd::pipeline_processes(layout->replica_comm())});
    strata::Model<strata_test::tp::Split<2>, S> model(pipeline, 3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = strata_test::error_of<strata::DistributedError>([&] {
        // Rank 3 leaves as it reads its 4th batch: the others are inside a step when they miss it.
        int batches = 0;
        auto data = strata_test::tp::tokens(400, 3).batch(8).map([&](std::span<float>, std::span<std::int32_t>) {
            if (++batches == 4 && coll::mpi::world_rank() == 3) std::_Exit(0);
        });
        model.fit(data, {.epochs = 1, .verbose = 0});
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(e);
    MESSAGE("rank " << coll::mpi::world_rank() << ": " << e);
    // Every rank names the one that left by the job's number (as mpirun does), whichever group it
    // waited in: the stage's shard group (rank 2, and rank 0 through its failed neighbour) or the
    // shard's pipeline (rank 1), both of which number it 1 among themselves. A stage waits for a
    // neighbour the pipeline's timeout plus the shard group's deadline (3 s here), so that rank 0
    // hears rank 2 name rank 3 instead of naming rank 2, which was only waiting too.
    const int me = coll::mpi::world_rank();
    // Rank 2 misses rank 3 in the first sum of their stage in that step: the gather of the
    // activations' halves that ranks 0 and 1 sent (scatter_gather).
    if (me == 2)
        CHECK(strata_test::has(e, "on rank 2 failed: across processes: Pipeline: the stage's shards gather the activations "
                                  "(scatter_gather): rank 3 of 4 did not arrive within 1500 ms"));
    if (me == 0) CHECK(strata_test::has(e, "its neighbour stage 1 (rank 2) failed: "));
    if (me == 0) CHECK(strata_test::has(e, "rank 3 of 4 did not arrive within 1500 ms"));
    if (me == 1) CHECK(strata_test::has(e, "stage 1 (rank 3) did not answer within 3000 ms"));
    // The longest wait: rank 1's 3 s for rank 3 (rank 2 names it after 1.5 s), the steps before,
    // and a margin for a loaded machine.
    CHECK(seconds < 3 * 1.5 + 10);
}

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    doctest::Context context(argc, argv);
    if (coll::mpi::world_rank() != 0) context.setOption("minimal", true);
    const int failed = context.run();
    std::fflush(stdout);
    std::_Exit(failed);  // not MPI_Finalize: it would wait for the rank that left
}
