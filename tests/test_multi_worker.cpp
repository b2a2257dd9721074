// MultiWorkerMirrored and its cross-process communicator, run by mpirun with 2 and 3 processes
// (tests/meson.build). Every process runs every case; the strategies must train exactly like
// one device on the same global batches, whatever the processes × replicas split, and a rank
// that is late or fails must be named on the others, never hang them.
#include <doctest/doctest.h>

#include "all_gather_check.hpp"
#include "padded_sequences.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <strata/strata.hpp>
#include <strata/distribute/multi_worker_mirrored.hpp>

#include "allocation_counter.hpp"  // every operator new and aligned_alloc of this program, counted
using strata_test::allocations;

using namespace strata::nn;
namespace dist = strata::distribute;
namespace coll = strata::distribute::collective;
using strata_test::lcg;
using strata_test::max_relative_difference;

namespace {

using Cnn = Sequential<Input<6, 6, 2>, Conv2D<3, 3, ReLU>, MaxPooling2D<2>, Flatten, Dense<5, Tanh>, Dropout<25>, Dense<3, Softmax>>;

int world_rank() { return coll::mpi::world_rank(); }
int world_size() { return coll::mpi::world_size(); }

std::vector<float> features(std::size_t n, std::uint64_t seed) {
    auto f = lcg(n * 72, seed, 0, 1);
    return std::vector<float>(f.begin(), f.end());
}
std::vector<std::int32_t> labels_of(const std::vector<float>& f, std::size_t n) {
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = std::int32_t((f[i * 72] + f[i * 72 + 7] > 1.0) + (f[i * 72 + 40] > 0.5));
    return y;
}
strata::data::Dataset<> images(std::size_t n, std::uint64_t seed) {
    auto f = features(n, seed);
    auto y = labels_of(f, n);
    return strata::data::Dataset<>::from_arrays(std::move(f), {6, 6, 2}, std::move(y));
}

// True when `v` is bitwise the same on every rank.
template <class T>
bool same_on_every_rank(std::vector<T> v) {
    auto root = v;
    MPI_Bcast(root.data(), int(root.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
    int same = std::memcmp(root.data(), v.data(), v.size() * sizeof(T)) == 0;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return same == 1;
}

template <class T, class Strategy>
std::vector<T> train(Strategy& s, strata::optim::Optimizer opt, const strata::data::Dataset<>& ds, int epochs = 2) {
    strata::Model<Cnn, Strategy, T> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(ds, {.epochs = epochs, .verbose = 0});
    return model.get_weights();
}

template <class T>
void check_exact(strata::optim::Optimizer opt, double tolerance) {
    // 10 per global batch does not divide by 2 × 2 or 3 × 2 replicas; 46 examples end with a
    // partial batch of 6.
    const auto ds = images(46, 5).batch(10);
    dist::OneDevice<> one;
    const auto reference = train<T>(one, opt, ds);
    for (int replicas : {1, 2}) {
        for (std::size_t bucket : {std::size_t(0), std::size_t(64)}) {
            CAPTURE(replicas);
            CAPTURE(bucket);
            dist::MultiWorkerMirrored<> mw(replicas, {.bucket_bytes = bucket});
            CHECK(mw.num_replicas_in_sync() == replicas * world_size());
            CHECK(mw.num_workers() == world_size());
            CHECK(mw.worker_index() == world_rank());
            const auto w = train<T>(mw, opt, ds);
            CHECK(max_relative_difference(w, reference) <= tolerance);
            CHECK(same_on_every_rank(w));
        }
    }
}

}  // namespace

TEST_CASE("MultiWorkerMirrored equals OneDevice on the same global batches (float64, Adam)") {
    check_exact<double>(strata::optim::Adam{.learning_rate = 0.01}, 1e-12);
}

TEST_CASE("MultiWorkerMirrored equals OneDevice on the same global batches (float32, SGD momentum)") {
    check_exact<float>(strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9}, 1e-6);
}

namespace {
template <class Prec, class Strategy>
std::vector<float> train_under(Strategy& s, strata::optim::Optimizer opt, const strata::data::Dataset<>& ds,
                               strata::optim::LossScaleState* scale = nullptr) {
    strata::Model<Cnn, Strategy, Prec> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    model.fit(ds, {.epochs = 2, .verbose = 0});
    if (scale) *scale = model.loss_scale();
    return model.get_weights();
}
}  // namespace

TEST_CASE("precision across processes: MixedBFloat16 equals one device; MixedFloat16 skips the same steps on every rank") {
    namespace prec = strata::precision;
    const auto ds = images(46, 5).batch(10);
    const strata::optim::Optimizer sgd = strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9};
    {
        dist::OneDevice<> one;
        const auto reference = train_under<prec::MixedBFloat16>(one, sgd, ds);
        dist::MultiWorkerMirrored<> mw(2);
        const auto w = train_under<prec::MixedBFloat16>(mw, sgd, ds);
        CHECK(max_relative_difference(w, reference) <= 1e-5);
        CHECK(same_on_every_rank(w));
    }
    {
        // A start of 2^40 overflows float16 for the first steps: every rank skips the same ones
        // (the reduced gradient is the same everywhere), as one device does.
        strata::optim::SGD scaled{.learning_rate = 0.1, .momentum = 0.9};
        scaled.loss_scale.initial_scale = 0x1p40;
        strata::optim::LossScaleState one_state, mw_state;
        dist::OneDevice<> one;
        const auto reference = train_under<prec::MixedFloat16>(one, scaled, ds, &one_state);
        dist::MultiWorkerMirrored<> mw(2);
        const auto w = train_under<prec::MixedFloat16>(mw, scaled, ds, &mw_state);
        CHECK(one_state.skipped_steps > 0);
        CHECK(mw_state.skipped_steps == one_state.skipped_steps);
        CHECK(mw_state.scale == one_state.scale);
        CHECK(same_on_every_rank(std::vector<double>{mw_state.scale, double(mw_state.skipped_steps)}));
        CHECK(same_on_every_rank(w));
        CHECK(max_relative_difference(w, reference) <= 1e-3);
    }
}

TEST_CASE("synchronized batch normalization: MultiWorkerMirrored equals OneDevice, moving statistics included (float64)") {
    // Statistics summed over every replica of every process, forward and backward; 10 per
    // global batch over 2 × 2 replicas leaves shards of 3 and 2.
    using Bn = Sequential<Input<6, 6, 2>, Conv2D<3, 3, Linear, 1, Padding::Same, false>, SyncBatchNormalization<0.9>,
                          ActivationLayer<ReLU>, MaxPooling2D<2>, Flatten, Dense<5, Tanh>, SyncBatchNormalization<0.9>, Dense<3, Softmax>>;
    using Plain = Sequential<Input<6, 6, 2>, Conv2D<3, 3, Linear, 1, Padding::Same, false>,
                             BatchNormalization<BatchNormOptions{.momentum = 0.9}>, ActivationLayer<ReLU>, MaxPooling2D<2>, Flatten,
                             Dense<5, Tanh>, BatchNormalization<BatchNormOptions{.momentum = 0.9}>, Dense<3, Softmax>>;
    const auto ds = images(46, 5).batch(10);
    const strata::optim::Optimizer opt = strata::optim::Adam{.learning_rate = 0.01};
    auto run = [&]<class N, class S>(S& s) {
        strata::Model<N, S, double> model(s, 11);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        model.fit(ds, {.epochs = 2, .verbose = 0});
        return model.get_weights();
    };
    dist::OneDevice<> one;
    const auto reference = run.template operator()<Bn>(one);
    for (int replicas : {1, 2})
        for (std::size_t bucket : {std::size_t(0), std::size_t(64)}) {
            CAPTURE(replicas);
            CAPTURE(bucket);
            dist::MultiWorkerMirrored<> mw(replicas, {.bucket_bytes = bucket});
            const auto w = run.template operator()<Bn>(mw);
            CHECK(max_relative_difference(w, reference) <= 1e-10);
            CHECK(same_on_every_rank(w));
        }
    // The negative control: each replica's statistics alone differ from the global batch's.
    dist::OneDevice<> one_plain;
    const auto plain_reference = run.template operator()<Plain>(one_plain);
    dist::MultiWorkerMirrored<> mw(1);
    const auto plain = run.template operator()<Plain>(mw);
    CHECK(max_relative_difference(plain, plain_reference) > 1e-4);
    CHECK(same_on_every_rank(plain));  // unsynchronized, the replicas still agree on every variable
}

TEST_CASE("a padded language model (mask_zero, per-token loss over the tokens that count), with and without sample weights, "
          "under MultiWorkerMirrored equals OneDevice (float64)") {
    // The loss's mean is over the real tokens of the global batch: their count is summed over
    // every replica of every process. Sequences alternate 1-2 and 7-8 real tokens, so the shards
    // of 10 examples over 2 x 2 replicas count different numbers.
    using Lm = strata_test::MaskedLm;
    // Sample weights (0.25, 1, 3 in turn) multiply each example's tokens' losses; the divisor stays
    // the global batch's count of real tokens (Keras 3), summed over every process.
    const auto ds = strata_test::padded_sequences(46, false).batch(10);
    const auto weighted = strata_test::padded_sequences(46, true).batch(10);
    const strata::optim::Optimizer opt = strata::optim::Adam{.learning_rate = 0.01};
    struct Result {
        std::vector<double> weights;
        strata::Evaluation evaluation;
        strata::train::History history;
    };
    auto run = [&]<class S>(S& s, const strata::data::Dataset<>& data) {
        strata::Model<Lm, S, double> model(s, 11);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        auto h = model.fit(data, {.epochs = 2, .verbose = 0});
        return Result{model.get_weights(), model.evaluate(data), std::move(h)};
    };
    for (const auto* data : {&ds, &weighted}) {
        CAPTURE(data == &weighted);
        dist::OneDevice<> one;
        const auto r1 = run(one, *data);
        for (int replicas : {1, 2}) {
            CAPTURE(replicas);
            dist::MultiWorkerMirrored<> mw(replicas);
            const auto r = run(mw, *data);
            CHECK(max_relative_difference(r.weights, r1.weights) <= 1e-10);
            CHECK(same_on_every_rank(r.weights));
            CHECK(r.evaluation.loss == doctest::Approx(r1.evaluation.loss).epsilon(1e-10));
            CHECK(r.evaluation.accuracy == doctest::Approx(r1.evaluation.accuracy).epsilon(1e-10));
            // The epochs' figures: the loss over the examples, the accuracy over the tokens that
            // count in every process's shards.
            for (const char* key : {"loss", "accuracy"})
                for (std::size_t e = 0; e < 2; ++e) CHECK(r.history[key][e] == doctest::Approx(r1.history[key][e]).epsilon(1e-10));
        }
    }
    // The weights move the training (the negative control).
    {
        dist::OneDevice<> one;
        CHECK(max_relative_difference(run(one, ds).weights, run(one, weighted).weights) > 1e-3);
    }
    // A rank whose Embedding does not mask padding has the same variables and summary, and is
    // another model all the same: refused on every rank, naming it.
    using Unmasked = Sequential<Input<8>, Embedding<8, 8>, PositionEmbedding<>,
                                Residual<LayerNormalization<>, MultiHeadAttention<2, 4, 0, MultiHeadAttentionOptions{.causal = true}>>,
                                TokenDense<8, Softmax>>;
    static_assert(Unmasked::num_params == Lm::num_params);
    CHECK(Unmasked::summary() == Lm::summary());
    dist::MultiWorkerMirrored<> mw(1, {.timeout = std::chrono::seconds(20)});
    const auto m = strata_test::error_of<strata::ValueError>([&] {
        if (world_rank() == 1) strata::Model<Unmasked, dist::MultiWorkerMirrored<>, double> model(mw, 1);
        else strata::Model<Lm, dist::MultiWorkerMirrored<>, double> model(mw, 1);
    });
    CHECK(m.find("the ranks disagree on the model: model: ") != std::string::npos);
    CHECK(m.find("rank 1 has " + std::to_string(Lm::num_params) + " parameters") != std::string::npos);
}

TEST_CASE("MultiWorkerMirrored over the MPI transport equals the shared-memory one") {
    const auto ds = images(40, 3).batch(8);
    const strata::optim::Optimizer opt = strata::optim::RMSprop{.learning_rate = 0.01};
    dist::MultiWorkerMirrored<> shm(2, {}, {.transport = coll::Transport::SharedMemory});
    dist::MultiWorkerMirrored<> mpi(2, {}, {.transport = coll::Transport::Mpi});
    CHECK(shm.process_group().transport() == coll::Transport::SharedMemory);
    CHECK(mpi.process_group().transport() == coll::Transport::Mpi);
    const auto a = train<double>(shm, opt, ds), b = train<double>(mpi, opt, ds);
    CHECK(max_relative_difference(a, b) <= 1e-13);
}

TEST_CASE("evaluate and predict under MultiWorkerMirrored give one device's figures on every rank") {
    const auto ds = images(37, 9).batch(9);
    dist::OneDevice<> one;
    strata::Model<Cnn, dist::OneDevice<>, double> ref(one, 3);
    dist::MultiWorkerMirrored<> mw(2);
    strata::Model<Cnn, dist::MultiWorkerMirrored<>, double> model(mw, 3);
    ref.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    const auto e1 = ref.evaluate(ds), e2 = model.evaluate(ds);
    CHECK(e2.examples == 37);
    CHECK(std::abs(e1.loss - e2.loss) <= 1e-12 * std::abs(e1.loss));
    CHECK(e1.accuracy == e2.accuracy);
    const auto p1 = ref.predict(ds), p2 = model.predict(ds);
    CHECK(p2.shape() == p1.shape());
    std::vector<double> a(p1.data(), p1.data() + p1.size()), b(p2.data(), p2.data() + p2.size());
    CHECK(max_relative_difference(b, a) <= 1e-12);
    CHECK(same_on_every_rank(b));
}

TEST_CASE("the initial variables are rank 0's, even when the processes are seeded differently") {
    dist::MultiWorkerMirrored<> mw(1);
    strata::Model<Cnn, dist::MultiWorkerMirrored<>, float> model(mw, std::uint64_t(100 + world_rank()));
    strata::Model<Cnn> chief(100);
    CHECK(model.get_weights() == chief.get_weights());
}

TEST_CASE("per-worker input: uneven shards join with zero gradients and equal one device on the concatenation") {
    // Worker w holds (w == 0 ? 3 : 2) batches of 4 examples. Step k trains on the k-th batch of
    // every worker that still has one, so one device sees the k-th batches concatenated in
    // worker order: batches of 4 N, 4 N, then 4 (worker 0 alone).
    const int n = world_size(), me = world_rank();
    auto count = [](int w) { return std::size_t(w == 0 ? 12 : 8); };
    std::vector<std::vector<float>> x(static_cast<std::size_t>(n));
    for (int w = 0; w < n; ++w) x[std::size_t(w)] = features(count(w), 100 + std::uint64_t(w));
    std::vector<float> joined;
    for (std::size_t b = 0; b < 3; ++b)
        for (int w = 0; w < n; ++w)
            if (4 * (b + 1) <= count(w))
                joined.insert(joined.end(), x[std::size_t(w)].begin() + std::ptrdiff_t(b * 4 * 72),
                              x[std::size_t(w)].begin() + std::ptrdiff_t((b + 1) * 4 * 72));
    const std::size_t total = joined.size() / 72;
    auto ref_ds = strata::data::Dataset<>::from_arrays(joined, {6, 6, 2}, labels_of(joined, total)).batch(4 * std::size_t(n));
    auto mine = strata::data::Dataset<>::from_arrays(x[std::size_t(me)], {6, 6, 2}, labels_of(x[std::size_t(me)], count(me))).batch(4);
    const strata::optim::Optimizer opt = strata::optim::Adam{.learning_rate = 0.02};
    dist::OneDevice<> one;
    const auto reference = train<double>(one, opt, ref_ds);
    for (int replicas : {1, 2}) {
        CAPTURE(replicas);
        dist::MultiWorkerMirrored<> mw(replicas, {}, {.input = dist::WorkerInput::PerWorker});
        strata::Model<Cnn, dist::MultiWorkerMirrored<>, double> model(mw, 11);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        const auto h = model.fit(mine, {.epochs = 2, .verbose = 0});
        CHECK(max_relative_difference(model.get_weights(), reference) <= 1e-12);
        CHECK(same_on_every_rank(model.get_weights()));
        // evaluate over the shards: every example of every worker counted once.
        const auto e = model.evaluate(mine);
        CHECK(e.examples == std::int64_t(12 + 8 * (n - 1)));
        CHECK(same_on_every_rank(std::vector<double>{double(h["loss"].back()), double(e.loss)}));
    }
}

TEST_CASE("after Model::build, the first train_step allocates nothing, whatever the input mode") {
    // train_step takes a global batch in both modes (fit is where per-worker input splits each
    // worker's own batch over its replicas; Model::build asks the path for that share).
    const int me = world_rank();
    auto x = features(280, 300 + std::uint64_t(me));
    auto ds = strata::data::Dataset<>::from_arrays(x, {6, 6, 2}, labels_of(x, 280)).batch(140);
    for (auto input : {dist::WorkerInput::Replicated, dist::WorkerInput::PerWorker}) {
        for (int replicas : {1, 2}) {
            CAPTURE(replicas);
            CAPTURE(int(input));
            dist::MultiWorkerMirrored<> mw(replicas, {}, {.input = input});
            strata::Model<Cnn, dist::MultiWorkerMirrored<>> model(mw, 11);
            model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
            auto it = ds.iterate(0);
            const auto& batch = *it;
            model.build(140);
            const long before = allocations.load();
            model.train_step(batch);
            const long allocated = allocations.load() - before;
            CHECK(allocated == 0);
            // Every rank stepped once (a rank's failed check must not leave the others waiting).
            CHECK(same_on_every_rank(model.get_weights()));
        }
    }
}

TEST_CASE("Model::build reserves the largest share the path hands a unit, whatever the input mode") {
    // train_step (above) takes a global batch in both modes; fit with per-worker input splits
    // each worker's own batch over its replicas only. build reserves largest_unit_share(n): it
    // must cover every share unit_share hands out, in both modes, or that first step allocates.
    // (Over the replicas of every process, as the global mode splits, a per-worker share would
    // be under-reserved by the number of processes.)
    const int me = world_rank();
    for (auto input : {dist::WorkerInput::Replicated, dist::WorkerInput::PerWorker}) {
        for (int replicas : {1, 2, 3}) {
            dist::MultiWorkerMirrored<> mw(replicas, {}, {.input = input});
            strata::Model<Cnn, dist::MultiWorkerMirrored<>> model(mw, 11);
            const auto& path = model.gradient_path();
            for (std::int64_t n : {1, 5, 12, 140, 141}) {
                CAPTURE(replicas);
                CAPTURE(int(input));
                CAPTURE(n);
                auto x = features(std::size_t(n), 400 + std::uint64_t(me));
                auto ds = strata::data::Dataset<>::from_arrays(x, {6, 6, 2}, labels_of(x, std::size_t(n))).batch(std::size_t(n));
                auto it = ds.iterate(0);
                const auto& batch = *it;
                // Every share this process's units get fits what build reserved. (Replicated: the
                // global batch over every replica of every process, so this process's units may
                // get a smaller share than another process's.)
                for (int r = 0; r < path.units(); ++r) CHECK(path.unit_share(batch, r).size <= path.largest_unit_share(n));
                if (input == dist::WorkerInput::PerWorker) CHECK(path.unit_share(batch, 0).size == path.largest_unit_share(n));
            }
        }
    }
}

TEST_CASE("sample weights: global and per-worker input weigh as one device does on the same batches") {
    auto weights = [](std::size_t count, std::size_t offset) {
        std::vector<float> w(count);
        for (std::size_t i = 0; i < count; ++i) w[i] = 0.25f * float((i + offset) % 5);   // zeros included
        return w;
    };
    const strata::optim::Optimizer opt = strata::optim::Adam{.learning_rate = 0.02};
    {   // Every process reads the same weighted global batches (9 does not divide by the replicas).
        auto f = features(37, 9);
        auto y = labels_of(f, 37);
        const auto ds = strata::data::Dataset<>::from_arrays(f, {6, 6, 2}, y, weights(37, 0)).batch(9);
        dist::OneDevice<> one;
        strata::Model<Cnn, dist::OneDevice<>, double> ref(one, 11);
        ref.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        const auto hr = ref.fit(ds, {.epochs = 2, .verbose = 0});
        dist::MultiWorkerMirrored<> mw(2);
        strata::Model<Cnn, dist::MultiWorkerMirrored<>, double> model(mw, 11);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        const auto h = model.fit(ds, {.epochs = 2, .verbose = 0});
        CHECK(max_relative_difference(model.get_weights(), ref.get_weights()) <= 1e-12);
        CHECK(max_relative_difference(h["loss"], hr["loss"]) <= 1e-12);
        const auto e = model.evaluate(ds), er = ref.evaluate(ds);
        CHECK(std::abs(e.loss - er.loss) <= 1e-12 * std::abs(er.loss));
        CHECK(e.accuracy == er.accuracy);
        // Unweighted, the same data train otherwise: the equality saw the weights.
        strata::Model<Cnn, dist::OneDevice<>, double> plain(one, 11);
        plain.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        plain.fit(strata::data::Dataset<>::from_arrays(f, {6, 6, 2}, y).batch(9), {.epochs = 2, .verbose = 0});
        CHECK(max_relative_difference(plain.get_weights(), ref.get_weights()) > 1e-6);
    }
    {   // Per-worker input: worker w's 8 examples weigh from offset w; step k is the k-th batches
        // of every worker, concatenated in worker order, weights with them.
        const int n = world_size(), me = world_rank();
        std::vector<float> joined, joined_w;
        std::vector<std::vector<float>> x(static_cast<std::size_t>(n));
        for (int w = 0; w < n; ++w) x[std::size_t(w)] = features(8, 200 + std::uint64_t(w));
        for (std::size_t b = 0; b < 2; ++b)
            for (int w = 0; w < n; ++w) {
                joined.insert(joined.end(), x[std::size_t(w)].begin() + std::ptrdiff_t(b * 4 * 72),
                              x[std::size_t(w)].begin() + std::ptrdiff_t((b + 1) * 4 * 72));
                const auto ww = weights(8, std::size_t(w));
                joined_w.insert(joined_w.end(), ww.begin() + std::ptrdiff_t(b * 4), ww.begin() + std::ptrdiff_t(b * 4 + 4));
            }
        const std::size_t total = joined.size() / 72;
        auto ref_ds = strata::data::Dataset<>::from_arrays(joined, {6, 6, 2}, labels_of(joined, total), joined_w).batch(4 * std::size_t(n));
        auto mine = strata::data::Dataset<>::from_arrays(x[std::size_t(me)], {6, 6, 2}, labels_of(x[std::size_t(me)], 8),
                                                         weights(8, std::size_t(me))).batch(4);
        dist::OneDevice<> one;
        const auto reference = train<double>(one, opt, ref_ds);
        dist::MultiWorkerMirrored<> mw(2, {}, {.input = dist::WorkerInput::PerWorker});
        strata::Model<Cnn, dist::MultiWorkerMirrored<>, double> model(mw, 11);
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
        model.fit(mine, {.epochs = 2, .verbose = 0});
        CHECK(max_relative_difference(model.get_weights(), reference) <= 1e-12);
        CHECK(same_on_every_rank(model.get_weights()));
    }
}

TEST_CASE("save writes once (the chief) and every rank loads it") {
    strata_test::TempDir dir("strata_mw");
    // The same path on every rank: rank 0's directory name.
    std::string path = (dir / "w.safetensors").string();
    std::vector<char> buf(path.begin(), path.end());
    buf.resize(512, '\0');
    MPI_Bcast(buf.data(), 512, MPI_CHAR, 0, MPI_COMM_WORLD);
    path = buf.data();
    dist::MultiWorkerMirrored<> mw(1);
    strata::Model<Cnn, dist::MultiWorkerMirrored<>, float> model(mw, 4);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    model.fit(images(24, 1).batch(6), {.epochs = 1, .verbose = 0});
    model.save(path);
    strata::Model<Cnn> back(0);
    back.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    back.load(path);
    CHECK(back.get_weights() == model.get_weights());
    MPI_Barrier(MPI_COMM_WORLD);  // nobody removes rank 0's directory before all loaded
}

TEST_CASE("ProcessGroup all-reduce, broadcast and barrier over both transports") {
    const int n = world_size(), me = world_rank();
    for (auto t : {coll::Transport::SharedMemory, coll::Transport::Mpi}) {
        CAPTURE(coll::to_string(t));
        coll::ProcessGroup pg(MPI_COMM_WORLD, 2, {.transport = t, .chunk_bytes = 1024});
        CHECK(pg.size() == n);
        CHECK(pg.rank() == me);
        for (std::size_t len : {std::size_t(0), std::size_t(1), std::size_t(5), std::size_t(1000), std::size_t(100003)}) {
            CAPTURE(len);
            std::vector<double> v(len);
            for (std::size_t i = 0; i < len; ++i) v[i] = double(i % 97) * (me + 1) + 0.5;
            pg.all_reduce(0, std::span<double>(v));
            bool ok = true;
            for (std::size_t i = 0; i < len; ++i)  // sum over ranks of (i%97)(r+1) + 0.5
                ok = ok && v[i] == double(i % 97) * (n * (n + 1) / 2) + 0.5 * n;
            CHECK(ok);
            std::vector<float> f(len, float(me + 1));
            pg.all_reduce(1, std::span<float>(f), coll::ReduceOp::Mean);
            CHECK(std::all_of(f.begin(), f.end(), [&](float x) { return x == float(n + 1) / 2; }));
            std::vector<double> b(len, double(me));
            pg.broadcast(0, std::span<double>(b), n - 1);
            CHECK(std::all_of(b.begin(), b.end(), [&](double x) { return x == double(n - 1); }));
        }
        // Both lanes at once, from two threads (a process's replicas do this with gradient slices).
        std::vector<float> a(30000, 1.0f), c(20000, 2.0f);
        std::thread other([&] { pg.all_reduce(1, std::span<float>(c)); });
        pg.all_reduce(0, std::span<float>(a));
        other.join();
        CHECK(a[29999] == float(n));
        CHECK(c[0] == float(2 * n));
        pg.barrier(0);
    }
}

TEST_CASE("ProcessGroup all-gather over both transports: every part bit for bit, even, uneven and empty parts, many chunks") {
    for (auto t : {coll::Transport::SharedMemory, coll::Transport::Mpi}) {
        CAPTURE(coll::to_string(t));
        coll::ProcessGroup pg(MPI_COMM_WORLD, 2, {.transport = t, .chunk_bytes = 1024});
        strata_test::check_all_gather(pg, 0);
        strata_test::check_all_gather(pg, 1);
        // Interleaved with the other collectives on one lane (they share its staging buffers).
        std::vector<double> v(3000, 1.0);
        pg.all_reduce(0, std::span<double>(v));
        strata_test::check_all_gather(pg, 0);
        pg.all_reduce(0, std::span<double>(v));
        CHECK(v[2999] == double(world_size()) * double(world_size()));
        // One part size per rank, summing to the buffer: refused on the rank that passes others.
        std::vector<float> f(10, 0.0f);
        const std::vector<std::int64_t> one{10};
        CHECK(strata_test::has(strata_test::error_of<strata::ValueError>([&] {
                                   pg.all_gather(0, std::span<float>(f), std::span<const std::int64_t>(one));
                               }),
                               "1 part sizes for " + std::to_string(world_size()) + " ranks"));
        std::vector<std::int64_t> eleven(std::size_t(world_size()), 0);
        eleven[0] = 11;
        CHECK(strata_test::has(strata_test::error_of<strata::ShapeError>([&] {
                                   pg.all_gather(0, std::span<float>(f), std::span<const std::int64_t>(eleven));
                               }),
                               "the parts hold 11 elements, the buffer 10"));
    }
}

TEST_CASE("the MPI transport's ring all-reduce: each element summed once in ring order, the same bits on every rank") {
    const int n = world_size(), me = world_rank();
    // Every rank's values are known to all (seeded by rank): the expected sum of chunk c of n
    // (as even as possible) is the float fold over ranks c, c + 1, ..., c + n - 1 (mod n).
    auto values = [](int rank, std::size_t len) {
        auto d = lcg(len, 1000 + std::uint64_t(rank), -1, 1);
        return std::vector<float>(d.begin(), d.end());
    };
    coll::ProcessGroup ring(MPI_COMM_WORLD, 1, {.transport = coll::Transport::Mpi, .ring_min_bytes = 0});
    coll::ProcessGroup iall(MPI_COMM_WORLD, 1, {.transport = coll::Transport::Mpi, .ring_min_bytes = SIZE_MAX});
    for (std::size_t len : {std::size_t(1), std::size_t(2), std::size_t(3), std::size_t(7), std::size_t(1000), std::size_t(100003)}) {
        CAPTURE(len);
        auto v = values(me, len);
        ring.all_reduce(0, std::span<float>(v));
        std::vector<std::vector<float>> all;
        for (int q = 0; q < n; ++q) all.push_back(values(q, len));
        bool ring_order = true, close = true;
        const bool ringed = len >= std::size_t(n);  // fewer elements than ranks: MPI_Iallreduce
        for (std::size_t i = 0; i < len; ++i) {
            double exact = 0;
            for (int q = 0; q < n; ++q) exact += all[std::size_t(q)][i];
            close = close && std::abs(double(v[i]) - exact) <= 1e-6 * (1 + std::abs(exact));
            if (!ringed) continue;
            int c = 0;  // i's chunk: [len * c / n, len * (c + 1) / n)
            while (std::size_t(std::int64_t(len) * (c + 1) / n) <= i) ++c;
            float fold = all[std::size_t(c)][i];
            for (int k = 1; k < n; ++k) fold = fold + all[std::size_t((c + k) % n)][i];
            ring_order = ring_order && std::memcmp(&fold, &v[i], sizeof(float)) == 0;
        }
        CHECK(close);
        CHECK(ring_order);
        CHECK(same_on_every_rank(v));
        // The other path (MPI_Iallreduce) agrees to rounding.
        auto w = values(me, len);
        iall.all_reduce(0, std::span<float>(w));
        CHECK(max_relative_difference(std::vector<double>(v.begin(), v.end()), std::vector<double>(w.begin(), w.end())) < 1e-5);
    }
    // Ranks that disagree on the threshold would take different paths: refused when they join.
    const auto msg = strata_test::error_of<strata::ValueError>([&] {
        coll::ProcessGroup g(MPI_COMM_WORLD, 1, {.transport = coll::Transport::Mpi, .ring_min_bytes = me == 0 ? 1024u : 2048u});
    });
    CHECK(msg.find("ring_min_bytes") != std::string::npos);
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("ProcessGroup over both transports: ranks that pass other lengths or part sizes all get a ShapeError naming both; "
          "the group goes on") {
    const int n = world_size(), me = world_rank();
    for (auto t : {coll::Transport::SharedMemory, coll::Transport::Mpi}) {
        CAPTURE(coll::to_string(t));
        coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.transport = t});
        std::vector<float> v(me == 1 ? 7 : 5, 1.0f);
        const std::string lengths = "rank 1 passed 7 elements but rank 0 passed 5";
        CHECK(strata_test::has(strata_test::error_of<strata::ShapeError>([&] { pg.all_reduce(0, std::span<float>(v)); }), lengths));
        CHECK(strata_test::has(strata_test::error_of<strata::ShapeError>([&] { pg.broadcast(0, std::span<float>(v), 0); }), lengths));
        std::vector<std::int64_t> counts(std::size_t(n), 0);
        counts[std::size_t(me)] = std::int64_t(v.size());
        CHECK(strata_test::has(strata_test::error_of<strata::ShapeError>([&] {
                                   pg.all_gather(0, std::span<float>(v), std::span<const std::int64_t>(counts));
                               }),
                               lengths));
        // The same 4n elements, split otherwise by rank 1.
        std::vector<std::int64_t> parts(std::size_t(n), 4);
        if (me == 1) {
            parts[0] = 3;
            parts[1] = 5;
        }
        std::vector<float> g(std::size_t(4 * n), 1.0f);
        CHECK(strata_test::has(strata_test::error_of<strata::ShapeError>([&] {
                                   pg.all_gather(0, std::span<float>(g), std::span<const std::int64_t>(parts));
                               }),
                               "rank 1 splits the " + std::to_string(4 * n) + " elements into other parts than rank 0"));
        // No data moved and nothing failed: the group goes on.
        CHECK(!pg.failed());
        std::vector<float> w(5, 1.0f);
        pg.all_reduce(0, std::span<float>(w));
        CHECK(w[4] == float(n));
        strata_test::check_all_gather(pg, 0);
    }
}

TEST_CASE("ProcessGroup over both transports: a rank that makes another collective call than rank 0 is named on every rank") {
    const int me = world_rank();
    for (auto t : {coll::Transport::SharedMemory, coll::Transport::Mpi}) {
        CAPTURE(coll::to_string(t));
        {  // all-gather where the others all-reduce
            coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.transport = t});
            std::vector<float> v(6, 1.0f);
            std::vector<std::int64_t> counts(std::size_t(world_size()), 0);
            counts[0] = 6;
            const auto msg = strata_test::error_of<strata::DistributedError>([&] {
                if (me == 1) pg.all_gather(0, std::span<float>(v), std::span<const std::int64_t>(counts));
                else pg.all_reduce(0, std::span<float>(v));
            });
            CHECK(strata_test::has(msg, "rank 1 called all_gather of float where rank 0 called all_reduce of float; "
                                        "every rank must make the same collective calls in the same order"));
            CHECK(pg.failed());
        }
        {  // another element type, and another root
            coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.transport = t});
            std::vector<float> f(6, 1.0f);
            std::vector<double> d(6, 1.0);
            const auto msg = strata_test::error_of<strata::DistributedError>([&] {
                if (me == 1) pg.all_reduce(0, std::span<double>(d));
                else pg.all_reduce(0, std::span<float>(f));
            });
            CHECK(strata_test::has(msg, "rank 1 called all_reduce of double where rank 0 called all_reduce of float"));
        }
        {
            coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.transport = t});
            std::vector<double> d(6, 1.0);
            const auto msg = strata_test::error_of<strata::DistributedError>([&] { pg.broadcast(0, std::span<double>(d), me == 1 ? 1 : 0); });
            CHECK(strata_test::has(msg, "rank 1 called broadcast of double from rank 1 where rank 0 called broadcast of double from rank 0"));
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

TEST_CASE("a rank that does not arrive is named on the others within the timeout") {
    const int n = world_size(), me = world_rank();
    for (auto t : {coll::Transport::SharedMemory, coll::Transport::Mpi}) {
        CAPTURE(coll::to_string(t));
        coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.timeout = std::chrono::milliseconds(400), .stall_warning = std::chrono::milliseconds(-1), .transport = t});
        pg.barrier(0);
        const auto start = std::chrono::steady_clock::now();
        std::string msg;
        if (me == n - 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // late: the others gave up
            msg = strata_test::error_of<strata::DistributedError>([&] { pg.barrier(0); });
            CHECK(!msg.empty());
        } else {
            msg = strata_test::error_of<strata::DistributedError>([&] { pg.barrier(0); });
            const auto waited = std::chrono::steady_clock::now() - start;
            CHECK(msg.find("rank " + std::to_string(n - 1) + " of " + std::to_string(n) + " did not arrive within 400 ms") != std::string::npos);
            CHECK(waited < std::chrono::milliseconds(2500));
        }
        CHECK(pg.failed());
        MPI_Barrier(MPI_COMM_WORLD);
    }
}

TEST_CASE("a rank that fails stops the others at once, naming it") {
    const int me = world_rank();
    coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.timeout = std::chrono::seconds(30), .transport = coll::Transport::SharedMemory});
    pg.barrier(0);
    const auto start = std::chrono::steady_clock::now();
    if (me == 1) {
        pg.abort("worker 1: out of memory in layer dense_1");
    } else {
        const auto msg = strata_test::error_of<strata::DistributedError>([&] { pg.barrier(0); });
        CHECK(msg.find("rank 1 of " + std::to_string(world_size()) + " failed: worker 1: out of memory in layer dense_1") != std::string::npos);
        CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("processes with different numbers of local replicas are refused on every rank") {
    const int me = world_rank();
    const auto msg = strata_test::error_of<strata::ValueError>([&] { dist::MultiWorkerMirrored<> mw(me == 1 ? 2 : 1); });
    CHECK(msg.find("every rank needs the same number of lanes (MultiWorkerMirrored: of local replicas)") != std::string::npos);
    CHECK(msg.find("rank " + std::to_string(me) + " has " + std::to_string(me == 1 ? 2 : 1) + ", the ranks have from 1 to 2") !=
          std::string::npos);
}

TEST_CASE("ranks that ask for different transports are refused on every rank, never hang") {
    // One rank in MPI_Comm_dup, the others in MPI_Win_allocate_shared, used to wait forever.
    const int me = world_rank();
    const auto t = me == 1 ? coll::Transport::Mpi : coll::Transport::SharedMemory;
    const auto start = std::chrono::steady_clock::now();
    const auto msg = strata_test::error_of<strata::ValueError>(
        [&] { coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.timeout = std::chrono::seconds(20), .transport = t}); });
    CHECK(msg.find("the ranks disagree on their settings") != std::string::npos);
    CHECK(msg.find("transport: " + std::string(world_size() == 2 ? "rank 0 has" : "ranks 0, 2 have") +
                   " shared_memory, rank 1 has mpi") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    // The same through the strategy, whose own settings join the process group's.
    const auto msg2 = strata_test::error_of<strata::ValueError>([&] {
        dist::MultiWorkerMirrored<> mw(1, {.timeout = std::chrono::seconds(20)}, {.transport = t});
    });
    CHECK(msg2.find("transport: ") != std::string::npos);
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a rank that never joins the process group is named on the others within the start-up deadline") {
    // The join waits for the processes to start (startup_timeout, by default the larger of the
    // step deadline and 30 s: a slow start under load is not a lost rank); set short here.
    const int n = world_size(), me = world_rank();
    if (me != n - 1) {
        const auto start = std::chrono::steady_clock::now();
        const auto msg = strata_test::error_of<strata::DistributedError>([&] {
            coll::ProcessGroup pg(MPI_COMM_WORLD, 1, {.timeout = std::chrono::milliseconds(200),
                                                      .stall_warning = std::chrono::milliseconds(-1),
                                                      .startup_timeout = std::chrono::milliseconds(500)});
        });
        CHECK(msg.find("set-up") != std::string::npos);
        CHECK(msg.find("rank " + std::to_string(n - 1) + " of " + std::to_string(n) + " did not arrive within 500 ms") !=
              std::string::npos);
        CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("processes whose settings differ are refused on every rank, naming who has what") {
    const int me = world_rank();
    dist::MultiWorkerOptions o;
    o.settings = {{"--batch-size", me == 1 ? "64" : "128"}, {"--seed", "42"}, {"--save", me == 1 ? "w.safetensors" : ""}};
    const auto msg = strata_test::error_of<strata::ValueError>([&] { dist::MultiWorkerMirrored<> mw(1, {}, o); });
    const std::string others = world_size() == 2 ? "rank 0 has" : "ranks 0, 2 have";
    CHECK(msg.find("--batch-size: " + others + " 128, rank 1 has 64") != std::string::npos);
    CHECK(msg.find("--save: " + others + " (none), rank 1 has w.safetensors") != std::string::npos);
    CHECK(msg.find("--seed") == std::string::npos);  // agreed: not named
    o.settings = {{"--batch-size", "128"}};
    dist::MultiWorkerMirrored<> fine(1, {}, o);
    CHECK(fine.num_workers() == world_size());
}

TEST_CASE("the GPUs' layout across processes: a GPU that holds the same lane of two processes is named, on every rank") {
    // What MultiWorkerMirrored<place::Cuda> decides NCCL or the host staging from (NCCL refuses a
    // communicator holding a GPU twice), counted over the job with the process group.
    const int me = world_rank(), n = world_size();
    dist::MultiWorkerMirrored<> mw(1);
    auto& pg = mw.process_group();
    std::vector<strata::place::LogicalDevice> one(1), two(2);
    one[0].physical_index = me;  // a GPU each
    CHECK(dist::detail::gpu_held_twice(pg, one) == "");
    one[0].physical_index = 0;  // all on GPU 0 (a logical GPU each)
    CHECK(dist::detail::gpu_held_twice(pg, one) == "GPU 0 of host 0 holds replica 0 of " + std::to_string(n) + " processes");
    // Two lanes: lane 0 on a GPU of each rank's own; lane 1 on GPU 5 in the first and the last rank.
    two[0].physical_index = me;
    two[1].physical_index = me == 0 || me == n - 1 ? 5 : 10 + me;
    CHECK(dist::detail::gpu_held_twice(pg, two) == "GPU 5 of host 0 holds replica 1 of 2 processes");
    // The same GPU in two lanes of one process is no duplicate in any lane's communicator.
    two[0].physical_index = two[1].physical_index = 20 + me;
    CHECK(dist::detail::gpu_held_twice(pg, two) == "");
}

using Mlp = Sequential<Input<6, 6, 2>, Flatten, Dense<5, Tanh>, Dense<3, Softmax>>;

TEST_CASE("a process with another model, loss, metrics, optimizer, precision or global batch size is refused on every rank before it trains") {
    const int me = world_rank();
    dist::MultiWorkerMirrored<> mw(1, {.timeout = std::chrono::seconds(20)});
    // The model: checked when it is built, before its initial variables are broadcast.
    const auto m = strata_test::error_of<strata::ValueError>([&] {
        if (me == 1) strata::Model<Mlp, dist::MultiWorkerMirrored<>, float> model(mw, 1);
        else strata::Model<Cnn, dist::MultiWorkerMirrored<>, float> model(mw, 1);
    });
    CHECK(m.find("the ranks disagree on the model: model: ") != std::string::npos);
    CHECK(m.find("rank 1 has " + std::to_string(Mlp::num_params) + " parameters") != std::string::npos);
    // The optimizer and its hyper-parameters: checked at compile.
    strata::Model<Cnn, dist::MultiWorkerMirrored<>, float> model(mw, 1);
    const auto o = strata_test::error_of<strata::ValueError>([&] {
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = me == 1 ? 0.05 : 0.1});
    });
    CHECK(o.find("the ranks disagree on compile's settings: optimizer: ") != std::string::npos);
    CHECK(o.find("rank 1 has SGD(learning_rate=0.050000000000000003, momentum=0, nesterov=false)") != std::string::npos);
    CHECK(o.find("precision") == std::string::npos);  // the ranks agree on it
    // The loss (another one, or the same one reading logits) and the metrics: a rank with another
    // loss all-reduces other gradients into the sum; one with other metrics sums other counts.
    const auto l = strata_test::error_of<strata::ValueError>([&] {
        model.compile(strata::loss::SparseCategoricalCrossentropy{.from_logits = me == 1}, strata::optim::SGD{.learning_rate = 0.1});
    });
    CHECK(l.find("the ranks disagree on compile's settings: loss: ") != std::string::npos);
    CHECK(l.find("rank 1 has sparse_categorical_crossentropy(from_logits=true)") != std::string::npos);
    CHECK(l.find("optimizer") == std::string::npos);
    const auto k = strata_test::error_of<strata::ValueError>([&] {
        std::vector<strata::metrics::Metric> metrics{"accuracy"};
        if (me == 1) metrics.push_back(strata::metrics::sparse_top_k_categorical_accuracy(2));
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1}, metrics);
    });
    CHECK(k.find("the ranks disagree on compile's settings: metrics: ") != std::string::npos);
    CHECK(k.find("rank 1 has accuracy (sparse_categorical), sparse_top_k_categorical_accuracy(k=2)") != std::string::npos);
    CHECK(k.find("loss") == std::string::npos);
    // The same metrics under other names (Keras' aliases, another order) agree.
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1},
                  me == 1 ? std::vector<strata::metrics::Metric>{"sparse_categorical_accuracy"}
                          : std::vector<strata::metrics::Metric>{"accuracy"});
    // The precision, chosen at run time (precision::Any): compared at compile with the optimizer.
    // A policy without a loss scale (bfloat16) leaves the optimizer's description unchanged, so
    // only this comparison can see it.
    {
        strata::Model<Mlp, dist::MultiWorkerMirrored<>, strata::precision::Any> any(mw, 1);
        if (me == 1) any.set_precision(strata::precision::Compute::BFloat16);
        const auto p = strata_test::error_of<strata::ValueError>(
            [&] { any.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1}); });
        CHECK(p.find("the ranks disagree on compile's settings: precision: ") != std::string::npos);
        CHECK(p.find("rank 1 has mixed_bfloat16") != std::string::npos);
        CHECK(p.find("optimizer") == std::string::npos);  // the optimizer is the same on every rank
        if (me == 1) any.set_precision(strata::precision::Compute::Float32);
        any.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});  // agreed
        any.fit(images(24, 1).batch(8), {.epochs = 1, .verbose = 0});
        CHECK(same_on_every_rank(any.get_weights()));
    }
    // The global batch: checked when an epoch starts, before its first step.
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    const auto before = model.get_weights();
    const auto b = strata_test::error_of<strata::ValueError>(
        [&] { model.fit(images(24, 1).batch(me == 1 ? 6 : 8), {.epochs = 1, .verbose = 0}); });
    CHECK(b.find("global batch size: ") != std::string::npos);
    CHECK(b.find("rank 1 has 6") != std::string::npos);
    CHECK(model.get_weights() == before);  // nothing trained
    model.fit(images(24, 1).batch(8), {.epochs = 1, .verbose = 0});  // agreed: trains
    CHECK(same_on_every_rank(model.get_weights()));
}
