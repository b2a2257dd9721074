// A pipeline across 4 processes (one stage each) whose stage 2 exits mid-training (std::_Exit,
// no MPI_Finalize): every other rank's fit throws DistributedError naming its rank (and, where
// they miss it inside a step, its stage and the micro-batch), within the deadline (the timeout times the stages on the waiting side), and
// nothing hangs. Run by `mpirun --enable-recovery -np 4` (tests/meson.build): without it Open MPI
// ends the whole job as soon as a process exits without finalizing, and strata's handling would
// not be what is tested. Its own main: the ranks left end without MPI_Finalize (one is gone).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>
#include <strata/distribute/pipeline_mpi.hpp>

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

int main(int argc, char** argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    doctest::Context context(argc, argv);
    if (coll::mpi::world_rank() != 0) context.setOption("minimal", true);
    const int failed = context.run();
    std::fflush(stdout);
    std::_Exit(failed);  // not MPI_Finalize: it would wait for the rank that left
}
