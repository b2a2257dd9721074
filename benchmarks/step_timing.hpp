// step_timing.hpp: timing a lockstep training step and its parts, shared by cost_model
// (Mirrored, in one process) and mwm_step (MultiWorkerMirrored, under mpirun).
#pragma once

#include <strata/strata.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace bench {

/// n MNIST-shaped examples of deterministic noise in [0, 1).
inline std::vector<float> synthetic_x(std::int64_t n) {
    std::vector<float> x(static_cast<std::size_t>(n) * 784);
    std::uint32_t s = 12345;
    for (auto& v : x) {
        s = s * 1664525u + 1013904223u;
        v = float(s >> 8) / float(1u << 24);
    }
    return x;
}
/// n labels 0, 1, ..., 9, 0, ...
inline std::vector<std::int32_t> synthetic_y(std::int64_t n) {
    std::vector<std::int32_t> y(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = std::int32_t(i % 10);
    return y;
}

/// MNIST's four arrays from `dir` when its files are there (`real`), else synthetic images and
/// labels of its shape (train_n and test_n of them): what the benchmarks that train the seed
/// CNN read.
struct MnistArrays {
    bool real = false;
    std::vector<float> train_x, test_x;
    std::vector<std::int32_t> train_y, test_y;
};
inline MnistArrays mnist_or_synthetic(const std::string& dir, std::int64_t train_n, std::int64_t test_n) {
    MnistArrays a;
    a.real = std::filesystem::exists(std::filesystem::path(dir) / "train-images-idx3-ubyte");
    if (a.real) {
        auto m = strata::data::load_mnist(dir);
        a.train_x = std::move(m.train.images.data);
        a.train_y = std::move(m.train.labels.data);
        a.test_x = std::move(m.test.images.data);
        a.test_y = std::move(m.test.labels.data);
    } else {
        a.train_x = synthetic_x(train_n);
        a.train_y = synthetic_y(train_n);
        a.test_x = synthetic_x(test_n);
        a.test_y = synthetic_y(test_n);
    }
    return a;
}

/// A lockstep configuration measured two ways in the same samples, so that load from other
/// processes on a shared machine hits both alike: `step`, the median seconds per train_step;
/// and the same step taken apart with the custom-loop pieces (begin_step, compute_gradients,
/// apply_gradients, end_step) and timestamps on every replica: `compute`, from the start of
/// the step until the last replica of this process has computed its gradients (waking the
/// replicas included, each replica computing beside the others: in situ); `apply`, from then
/// until the last replica has all-reduced and updated; `join`, from then until the step
/// returns.
struct MirroredTiming {
    double step = NAN, compute = NAN, apply = NAN, join = NAN;
};

/// Times `reps` samples (after one untimed) of `steps` steps of Net under `strategy` on one
/// synthetic global batch of `batch` examples (RMSprop, sparse cross-entropy); each step is
/// taken once apart and once whole (train_step), in turn; medians. Each
/// sample's per-step means are passed through `combine` (e.g. the maximum over processes)
/// before the median is taken.
template <class Net, class Strategy, class Combine>
MirroredTiming time_steps(Strategy& strategy, std::int64_t batch_size, int steps, int reps, Combine&& combine) {
    using Clock = std::chrono::steady_clock;
    namespace sd = strata::distribute;
    strata::Model<Net, Strategy> model(strategy, 42);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
    auto ds = strata::data::Dataset<>::from_arrays(synthetic_x(batch_size), {28, 28, 1}, synthetic_y(batch_size))
                  .batch(std::size_t(batch_size));
    auto it = ds.iterate(0);
    const auto& batch = *it;
    const int local = strategy.local_replicas();
    const int all = strategy.num_replicas_in_sync(), first = strategy.first_replica();
    std::vector<double> v_step, v_compute, v_apply, v_join;
    std::vector<Clock::time_point> t1(static_cast<std::size_t>(local)), t2(static_cast<std::size_t>(local));
    auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    for (int s = 0; s <= reps; ++s) {
        double parts[4] = {0, 0, 0, 0};  // step, compute, apply, join
        for (int k = 0; k < steps; ++k) {
            const auto t0 = Clock::now();
            model.begin_step();
            strategy.run([&](sd::ReplicaContext& ctx) {
                const int r = ctx.replica_id_in_sync_group();
                model.compute_gradients(ctx, sd::split_batch(batch, all, first + r));
                t1[std::size_t(r)] = Clock::now();
                model.apply_gradients(ctx);
                t2[std::size_t(r)] = Clock::now();
            });
            model.end_step(std::int64_t(batch.size()));
            const auto t3 = Clock::now();
            const auto last1 = *std::max_element(t1.begin(), t1.end()), last2 = *std::max_element(t2.begin(), t2.end());
            parts[1] += secs(t0, last1);
            parts[2] += secs(last1, last2);
            parts[3] += secs(last2, t3);
            // The whole step right after its parts, step by step, so that a burst of load hits both.
            const auto t4 = Clock::now();
            model.train_step(batch);
            parts[0] += secs(t4, Clock::now());
        }
        for (auto& p : parts) p /= steps;
        combine(parts);
        if (s > 0) {
            v_step.push_back(parts[0]);
            v_compute.push_back(parts[1]);
            v_apply.push_back(parts[2]);
            v_join.push_back(parts[3]);
        }
    }
    return {median(v_step), median(v_compute), median(v_apply), median(v_join)};
}

template <class Net, class Strategy>
MirroredTiming time_steps(Strategy& strategy, std::int64_t batch_size, int steps, int reps) {
    return time_steps<Net>(strategy, batch_size, steps, reps, [](double*) {});
}

}  // namespace bench
