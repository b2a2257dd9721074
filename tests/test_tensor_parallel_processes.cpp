// Tensor parallelism across processes (issue 43; distribute/tensor_parallel_mpi.hpp), run by
// `mpirun -np 4` (tests/meson.build): the transformer of test_tensor_parallel.cpp with its
// attention split by heads and its MLP column-then-row, shard j on rank j, trains under
// OneDevice in each process as the unsplit transformer on one device (float64 to 1e-12), over 2
// processes (ranks {0, 1} and {2, 3}, each pair a job of its own) and over all 4; every process
// ends with the same bits; rank 0 is the chief; 2 replicas of 2 shards (MultiWorkerMirrored over
// the replicas) equal it too, and so do 2 pipeline stages of 2 shards each (pipeline × tensor); a
// layer split another number of ways than the group has
// processes, a second replica thread, and shard pipelines or replicas started with other settings
// are ValueErrors on every rank; a backup written by
// rank 0 resumes every rank bit for bit.
#include <doctest/doctest.h>

#include "all_gather_check.hpp"
#include "tensor_parallel_nets.hpp"
#include "test_util.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <unistd.h>
#include <memory>
#include <string>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/tensor_parallel.hpp>
#include <strata/distribute/tensor_parallel_attention.hpp>
#include <strata/distribute/multi_worker_mirrored.hpp>
#include <strata/distribute/tensor_parallel_mpi.hpp>
#include <strata/distribute/pipeline_mpi.hpp>

using namespace strata::nn;
namespace dist = strata::distribute;
namespace coll = strata::distribute::collective;

namespace {

// The transformer of test_tensor_parallel.cpp: two pre-norm encoder blocks on [6, 12] examples,
// attention 4 heads (key size 3, value size 2), MLP 22 GELU (the hidden features split 11+11
// and 6+6+5+5).
using strata_test::tp::tokens;
using strata_test::tp::Transformer;
using strata_test::tp::Unsplit;
using strata_test::tp::Split;

// What the split layers hand their group per step of `batch` examples, Megatron's count plus the
// gathered variable gradients. Summed: per encoder block one [batch·S, F] forward (attention's
// output; the MLP's row-parallel output) and, training, one backward (the input gradients of
// each). Gathered, training: the split variables' gradients, three gathers per block (the
// attention's query, key and value kernels and biases and its output kernel; the MLP's first
// kernel and bias; its second kernel). The paired MLP's hidden columns never cross.
constexpr std::int64_t blocks = 2;
std::int64_t summed_per_step(std::int64_t batch, bool training) {
    constexpr std::int64_t S = 6, F = 12;
    return blocks * (batch * S * F) * (training ? 4 : 2);
}
template <bool Bias>
std::int64_t gathered_per_step() {
    constexpr std::int64_t F = 12, H = 4, Dk = 3, Dv = 2, Hidden = 22;
    const std::int64_t attention = 2 * F * H * Dk + F * H * Dv + H * Dv * F + (Bias ? 2 * H * Dk + H * Dv : 0);
    const std::int64_t mlp = F * Hidden + Hidden + Hidden * F;
    return blocks * (attention + mlp);
}

struct Run {
    std::vector<double> weights, loss;
    strata::Evaluation eval;
    bool chief = false;
    std::int64_t messages_sent = 0, message_bytes_sent = 0;  // a pipeline across processes: to its neighbours
};

template <class Net, class Strategy>
Run train(Strategy& s) {
    strata::Model<Net, Strategy, double> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    auto h = model.fit(tokens(40, 3).batch(10), {.epochs = 2, .verbose = 0});
    Run run{model.get_weights(), h.history.at("loss"), model.evaluate(tokens(24, 5).batch(8)), s.is_chief()};
    if constexpr (requires { model.gradient_path().pipeline_stats(); }) {
        run.messages_sent = model.gradient_path().pipeline_stats().messages_sent;
        run.message_bytes_sent = model.gradient_path().pipeline_stats().message_bytes_sent;
    }
    return run;
}

// The sum of v over every rank of the job.
std::int64_t job_sum(std::int64_t v) {
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return v;
}

// A split run against the unsplit reference: the weights, the losses of each epoch and
// evaluate's figures, float64 to 1e-12.
void check_equal(const Run& got, const Run& ref) {
    const double diff = strata_test::max_relative_difference(got.weights, ref.weights);
    INFO("largest relative weight difference " << diff);
    CHECK(diff <= 1e-12);
    CHECK(strata_test::max_relative_difference(got.loss, ref.loss) <= 1e-12);
    CHECK(got.eval.loss == doctest::Approx(ref.eval.loss).epsilon(1e-12));
    CHECK(got.eval.accuracy == doctest::Approx(ref.eval.accuracy).epsilon(1e-12));
}

int world_rank() { return coll::mpi::world_rank(); }

// Splits the world into groups of `n` consecutive ranks and checks that each group, as the job's
// tensor-parallel group, trains Split<n> as Unsplit on one device.
template <int N, MultiHeadAttentionOptions O = MultiHeadAttentionOptions{}, class Net = Split<N, O>, class Reference = Unsplit<O>>
void check_across() {
    dist::OneDevice<> alone;
    const Run ref = train<Reference>(alone);  // before the group: no split layer runs here
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() / N, world_rank() % N, &comm);
    {
        auto group = dist::tensor_parallel_processes(comm, {.timeout = std::chrono::seconds(30)});
        REQUIRE(group->shards() == N);
        CHECK(group->shard() == world_rank() % N);
        dist::OneDevice<> one;
        const Run got = train<Net>(one);
        check_equal(got, ref);
        CHECK(got.chief == (group->shard() == 0));
        // Every process of the group holds the same bits (shard 0's, broadcast).
        std::vector<double> first = got.weights;
        group->group().broadcast(0, std::span<double>(first), 0);
        CHECK(first == got.weights);
        // What crossed: 8 steps of 10 examples, then 3 evaluation batches of 8, against the
        // formula (the paired MLP: 8 sums and 6 gathers a step, 4 sums a batch of inference).
        if constexpr (std::is_same_v<Net, Split<N, O>>) {
            const auto t = group->traffic();
            CHECK(t.sums == 8 * 8 + 3 * 4);
            CHECK(t.bytes == std::int64_t(sizeof(double)) * (8 * summed_per_step(10, true) + 3 * summed_per_step(8, false)));
            CHECK(t.gathers == 8 * 3 * blocks);
            CHECK(t.gathered_bytes == std::int64_t(sizeof(double)) * 8 * gathered_per_step<O.use_bias>());
        }
    }
    MPI_Comm_free(&comm);
    // The group is gone: the split layers are threads again, and the process is its own chief.
    CHECK(dist::job_shard_group() == nullptr);
    CHECK(alone.is_chief());
}

}  // namespace

TEST_CASE("tensor parallelism across 2 and 4 processes equals the unsplit transformer on one device (float64)") {
    REQUIRE(coll::mpi::world_size() == 4);
    check_across<2>();
    check_across<4>();
}

TEST_CASE("data x tensor across processes: 2 replicas (MultiWorkerMirrored) of 2 shards equal the unsplit transformer on one device") {
    // Replica r: ranks 2r and 2r + 1; shard j of both replicas: ranks j and 2 + j. Each replica
    // takes its half of every global batch of 10; 4 and 6 do not matter to the shards.
    dist::OneDevice<> alone;
    const Run ref = train<Unsplit<>>(alone);
    {
        auto layout = dist::tensor_parallel_replicas(2, {.timeout = std::chrono::seconds(30)});
        CHECK(layout->replicas() == 2);
        CHECK(layout->replica() == world_rank() / 2);
        CHECK(layout->shards().shard() == world_rank() % 2);
        dist::MultiWorkerMirrored<> s(1, {.timeout = std::chrono::seconds(30)}, {.comm = layout->replica_comm()});
        CHECK(s.num_replicas_in_sync() == 2);
        const Run got = train<Split<2>>(s);
        check_equal(got, ref);
        CHECK(got.chief == (world_rank() == 0));
        // Each process's shard summed over its replica's batch share: the same calls as one
        // replica, on half the rows.
        const auto t = layout->shards().traffic();
        CHECK(t.sums == 8 * 8 + 3 * 4);
        CHECK(t.gathers == 8 * 3 * blocks);
    }
    CHECK(dist::job_shard_group() == nullptr);
}

TEST_CASE("ShardGroup::gather: every process ends with every part bit for bit (-0, infinities, NaN, parts of unequal size)") {
    // Over the 4 processes and over pairs, floats and doubles, lengths that split evenly or not
    // (and fewer elements than processes): part j (shard_part's) is written by process j; the
    // rest is garbage. (ProcessGroup::all_gather's parts of any size: test_multi_worker.cpp.)
    for (const int n : {4, 2}) {
        MPI_Comm comm;
        MPI_Comm_split(MPI_COMM_WORLD, world_rank() / n, world_rank() % n, &comm);
        {
            auto group = dist::tensor_parallel_processes(comm, {.timeout = std::chrono::seconds(30)});
            const int me = group->shard();
            for (const std::int64_t len : {1, 3, 7, 10, 1001}) {
                CAPTURE(n);
                CAPTURE(len);
                auto d = std::vector<double>(static_cast<std::size_t>(len), 12345.0);
                auto f = std::vector<float>(static_cast<std::size_t>(len), 12345.0f);
                const auto [first, count] = dist::detail::shard_part(len, n, me);
                for (std::int64_t i = first; i < first + count; ++i) {
                    d[std::size_t(i)] = strata_test::all_gather_value(i);
                    f[std::size_t(i)] = float(strata_test::all_gather_value(i));
                }
                group->gather(std::span<double>(d), "test gather (double)");
                group->gather(std::span<float>(f), "test gather (float)");
                CHECK(strata_test::holds_all_gather_values(d, f));
            }
            CHECK(group->traffic().gathers == 10);
            CHECK(group->traffic().sums == 0);
        }
        MPI_Comm_free(&comm);
    }
}

TEST_CASE("pipeline x tensor across processes: 2 stages (one block each) of 2 shards equal the unsplit transformer on one device; "
          "under mpirun -np 8, 2 replicas of them (the hybrid, all three)") {
    // Stage s of replica r: ranks 2(2r + s) and 2(2r + s) + 1, its block's attention and MLP split
    // over the two; shard j's pipeline: ranks j, 2 + j (, 4 + j, 6 + j). Micro-batches of 2 or 3
    // examples (batches of 10 in 4; with 2 replicas, halves of 5 in 4).
    const int R = coll::mpi::world_size() / 4;
    REQUIRE(R * 4 == coll::mpi::world_size());
    dist::OneDevice<> alone;
    const Run ref = train<Unsplit<>>(alone);
    // Between the stages each shard sends its neighbour's same shard half of every message,
    // which that stage's pair gathers (scatter_gather, the default), or the whole (off): the
    // same training either way, half the bytes.
    Run whole, parts;
    dist::TensorParallelProcesses::Traffic traffic[2];
    for (const bool scatter : {false, true}) {
        CAPTURE(scatter);
        auto layout = dist::tensor_parallel_replicas(2, {.timeout = std::chrono::seconds(30)});
        using S = dist::Pipeline<strata::place::Host, dist::OneFOneB, dist::split::At<2>>;
        S s({.micro_batches = 4, .replicas = R, .timeout = std::chrono::seconds(30),
             .processes = dist::pipeline_processes(layout->replica_comm()), .scatter_gather = scatter});
        CHECK(s.num_replicas_in_sync() == R);
        CHECK(s.scatter_gather() == scatter);
        const Run got = train<Split<2>>(s);
        check_equal(got, ref);
        CHECK(got.chief == (world_rank() == 0));  // shard 1's pipeline has a rank 0 too: not a chief
        // Every stage's split layers summed over their own pair: a block's sums each, the same count.
        const auto t = layout->shards().traffic();
        CHECK(t.sums > 0);
        std::vector<std::int64_t> sums(std::size_t(coll::mpi::world_size()), 0);
        sums[std::size_t(world_rank())] = t.sums;
        MPI_Allreduce(MPI_IN_PLACE, sums.data(), int(sums.size()), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        for (const auto v : sums) CHECK(v == t.sums);
        // The stage's block gathers its split variables' gradients after each micro-batch's
        // backward: 3 gathers, 4 micro-batches, 8 steps.
        CHECK(got.messages_sent > 0);
        CHECK(t.gathers >= 8 * 4 * 3);
        (scatter ? parts : whole) = got;
        traffic[scatter ? 1 : 0] = t;
    }
    // On top of those, every message received was gathered once, whole (twice the half that
    // crossed).
    CHECK(traffic[0].gathers == 8 * 4 * 3);
    CHECK(traffic[1].sums == traffic[0].sums);
    CHECK(job_sum(traffic[1].gathers - traffic[0].gathers) == job_sum(parts.messages_sent));
    CHECK(job_sum(traffic[1].gathered_bytes - traffic[0].gathered_bytes) == 2 * job_sum(parts.message_bytes_sent));
    CHECK(parts.messages_sent == whole.messages_sent);
    CHECK(2 * parts.message_bytes_sent == whole.message_bytes_sent);
    CHECK(parts.weights == whole.weights);  // a part arrives bit for bit
    CHECK(dist::job_shard_group() == nullptr);
    // A message smaller than the shards: a stage boundary of one feature and micro-batches of one
    // example, so each message is one value, shard 0's part the whole and shard 1's empty; both
    // shards still gather it.
    using Tiny = Sequential<Input<6, 12>, Flatten, Dense<1>, Dense<3, Softmax>>;
    auto train_tiny = [](auto& strategy) {
        strata::Model<Tiny, std::remove_reference_t<decltype(strategy)>, double> model(strategy, 5);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
        model.fit(tokens(8, 3).batch(4), {.epochs = 2, .verbose = 0});
        return model.get_weights();
    };
    dist::OneDevice<> one;
    const std::vector<double> tiny_ref = train_tiny(one);
    {
        auto layout = dist::tensor_parallel_replicas(2, {.timeout = std::chrono::seconds(30)});
        using S = dist::Pipeline<strata::place::Host, dist::OneFOneB, dist::split::At<2>>;
        S s({.micro_batches = 4, .replicas = R, .timeout = std::chrono::seconds(30),
             .processes = dist::pipeline_processes(layout->replica_comm())});
        REQUIRE(s.scatter_gather());
        CHECK(strata_test::max_relative_difference(train_tiny(s), tiny_ref) <= 1e-12);
        CHECK(layout->shards().traffic().gathers > 0);
    }
}

TEST_CASE("across processes, pipeline x tensor and data x tensor: shards whose pipelines or replicas were started with other "
          "settings are refused at start on every rank, naming them") {
    REQUIRE(coll::mpi::world_size() == 4);
    // Shard 1's pipeline (ranks 1 and 3) takes 2 micro-batches, shard 0's 4: each pipeline agrees
    // within itself, and their stages' split layers would sum buffers of other sizes.
    {
        auto layout = dist::tensor_parallel_replicas(2, {.timeout = std::chrono::seconds(30)});
        using S = dist::Pipeline<strata::place::Host, dist::OneFOneB, dist::split::At<2>>;
        const std::string msg = strata_test::error_of([&] {
            S s({.micro_batches = world_rank() % 2 == 0 ? 4 : 2, .timeout = std::chrono::seconds(30),
                 .processes = dist::pipeline_processes(layout->replica_comm())});
        });
        INFO(msg);
        CHECK(strata_test::has(msg, "the pipeline's settings (across the shards of the tensor-parallel group: 2 MPI processes)"));
        CHECK(strata_test::has(msg, "micro_batches"));
    }
    // Scatter-gather between stages needs Megatron's layout: each tensor-parallel group one
    // stage, each pipeline one shard. A pipeline over the whole job puts the group {0, 1} on
    // stages 0 and 1; pipelines {0, 3} and {1, 2} hold both shards each.
    {
        auto layout = dist::tensor_parallel_replicas(2, {.timeout = std::chrono::seconds(30)});
        using S = dist::Pipeline<strata::place::Host, dist::OneFOneB, dist::split::At<2>>;
        std::string msg = strata_test::error_of([&] {
            S s({.replicas = 2, .timeout = std::chrono::seconds(30), .processes = dist::pipeline_processes(MPI_COMM_WORLD)});
        });
        INFO(msg);
        CHECK(strata_test::has(msg, "a stage's processes must be one tensor-parallel group"));
        CHECK(strata_test::has(msg, world_rank() < 2 ? "rank 0 has stage 0 of replica 0, rank 1 has stage 1 of replica 0"
                                                     : "rank 2 has stage 0 of replica 1, rank 3 has stage 1 of replica 1"));
        MPI_Comm mixed;
        MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 || world_rank() == 3 ? 0 : 1, world_rank() / 2, &mixed);
        msg = strata_test::error_of([&] { S s({.timeout = std::chrono::seconds(30), .processes = dist::pipeline_processes(mixed)}); });
        CHECK(strata_test::has(msg, "the ranks of a pipeline must hold the same shard of their stages' tensor-parallel groups"));
        // Without scatter-gather nothing crosses between the shards of a stage: the layout is the program's.
        msg = strata_test::error_of([&] {
            S s({.timeout = std::chrono::seconds(30), .processes = dist::pipeline_processes(mixed), .scatter_gather = false});
        });
        CHECK(msg.empty());
        MPI_Comm_free(&mixed);
    }
    // Shard 1's replicas (ranks 1 and 3) compile another learning rate than shard 0's: each
    // MultiWorkerMirrored agrees within itself, and the two halves of every replica would part.
    {
        auto layout = dist::tensor_parallel_replicas(2, {.timeout = std::chrono::seconds(30)});
        dist::MultiWorkerMirrored<> s(1, {.timeout = std::chrono::seconds(30)}, {.comm = layout->replica_comm()});
        strata::Model<Split<2>, dist::MultiWorkerMirrored<>, double> model(s, 11);
        const std::string msg = strata_test::error_of([&] {
            model.compile(strata::loss::SparseCategoricalCrossentropy{},
                          strata::optim::Adam{.learning_rate = world_rank() % 2 == 0 ? 0.01 : 0.02});
        });
        INFO(msg);
        CHECK(strata_test::has(msg, "compile's settings (across the shards of the tensor-parallel group: 2 MPI processes)"));
        CHECK(strata_test::has(msg, "optimizer"));
    }
    CHECK(dist::job_shard_group() == nullptr);
}

namespace {
// Stops fit (as StopOnSignal does) after its `at`-th batch, on every rank alike.
struct StopAt : strata::train::Callback {
    std::int64_t at, batches = 0;
    explicit StopAt(std::int64_t a) : at(a) {}
    void on_train_batch_end(strata::train::TrainingContext& ctx, std::int64_t, const strata::train::Logs&) override {
        if (++batches == at) ctx.stop_training = true;
    }
};
}  // namespace

TEST_CASE("across processes, BackupAndRestore: rank 0 writes the backup, every rank resumes from it, bit for bit") {
    namespace tr = strata::train;
    auto group = dist::tensor_parallel_processes(MPI_COMM_WORLD, {.timeout = std::chrono::seconds(30)});
    auto fit = [](strata::Model<Split<4>, dist::OneDevice<>, double>& m, tr::CallbackList callbacks) {
        m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
        return m.fit(tokens(40, 3).batch(10), {.epochs = 2, .callbacks = std::move(callbacks), .verbose = 0});
    };
    dist::OneDevice<> a, b, c;
    strata::Model<Split<4>, dist::OneDevice<>, double> straight(a, 11);
    const auto full = fit(straight, {});
    // One folder for the job: rank 0's name for it.
    long long pid = world_rank() == 0 ? (long long)::getpid() : 0;
    MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    const auto dir = std::filesystem::temp_directory_path() / ("strata_tp_backup_" + std::to_string(pid));
    auto backup = std::make_shared<tr::BackupAndRestore>(dir.string(), tr::BackupOptions{.save_every_steps = 3});
    {
        strata::Model<Split<4>, dist::OneDevice<>, double> first(b, 11);
        fit(first, {backup, std::make_shared<StopAt>(6)});  // stopped at epoch 1, batch 2: backed up there
    }
    group->group().barrier(0);  // rank 0 has written it (a relaunch would find it written)
    CHECK(std::filesystem::exists(backup->file()));
    strata::Model<Split<4>, dist::OneDevice<>, double> second(c, 11);
    const auto resumed = fit(second, {backup});
    REQUIRE(backup->restored());
    CHECK(backup->restored()->epoch == 1);
    CHECK(backup->restored()->batches == 2);
    CHECK(second.get_weights() == straight.get_weights());
    CHECK(resumed["loss"].back() == full["loss"].back());
    group->group().barrier(0);
    if (world_rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("across processes, a column-parallel layer whose output goes to an unsplit layer, or whose activation is Softmax, gathers "
          "it (no pair)") {
    // The MLP's second layer whole: the hidden columns must be gathered for it (forward), and
    // their gradient summed back (backward, the unsplit layer's input gradient is whole).
    using Unpaired = Transformer<dist::TensorParallelMultiHeadAttention<4, 3, 2, 2>, dist::TensorParallelTokenDense<22, GELU, 2, dist::Columns>,
                                 TokenDense<12>>;
    check_across<2, MultiHeadAttentionOptions{}, Unpaired>();
    // A Softmax MLP layer is never paired: its activation needs the whole row, gathered first.
    using SoftmaxMlp = Transformer<dist::TensorParallelMultiHeadAttention<4, 3, 2, 2>, dist::TensorParallelTokenDense<22, Softmax, 2, dist::Columns>,
                                   dist::TensorParallelTokenDense<12, Linear, 2, dist::Rows>>;
    check_across<2, MultiHeadAttentionOptions{}, SoftmaxMlp, Transformer<MultiHeadAttention<4, 3, 2>, TokenDense<22, Softmax>, TokenDense<12>>>();
}

TEST_CASE("across processes with the causal mask and no biases, and with attention dropout (each rank draws its heads' masks)") {
    constexpr MultiHeadAttentionOptions causal{.use_bias = false, .causal = true};
    check_across<2, causal>();
    constexpr MultiHeadAttentionOptions dropout{.dropout = 0.25};
    check_across<4, dropout>();
}

TEST_CASE("across processes: a layer split another number of ways than the group has processes, and a second replica, are refused") {
    auto group = dist::tensor_parallel_processes(MPI_COMM_WORLD, {.timeout = std::chrono::seconds(30)});
    dist::OneDevice<> one;
    std::string msg = strata_test::error_of([&] { train<Split<2>>(one); });
    INFO(msg);
    CHECK(strata_test::has(msg, "TensorParallelMultiHeadAttention is split over 2 shards, but the job's tensor-parallel group has 4 MPI "
                                "processes: start one process per shard (mpirun -np 2)"));
    // 4 processes are not replicas of 3 shards: refused on every rank before any split.
    msg = strata_test::error_of([&] { dist::tensor_parallel_replicas(3); });
    CHECK(strata_test::has(msg, "tensor_parallel_replicas: 4 processes are not replicas of 3 shards each (mpirun -np R·3)"));
    // A second group in the same job.
    msg = strata_test::error_of([&] { dist::TensorParallelProcesses again(MPI_COMM_WORLD); });
    CHECK(strata_test::has(msg, "the job already has a tensor-parallel group"));
    // Mirrored's replicas run on threads of their own: not the thread that ran the first split layer.
    dist::OneDevice<> first;
    train<Split<4>>(first);
    dist::Mirrored<> two(2);
    msg = strata_test::error_of([&] { train<Split<4>>(two); });
    INFO(msg);
    CHECK(strata_test::has(msg, "runs the split layers on one thread of each process"));
}
