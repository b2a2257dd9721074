// Model::load: validated as a whole before anything changes (a failed load leaves the model as it
// was), strict about unknown tensors and another optimizer unless asked not to be, strict about
// metadata integers, and the learning rate comes back.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <strata/strata.hpp>

using namespace strata::nn;
using strata_test::error_of;
using strata_test::has;
using strata_test::lcg;

namespace {

using Net = Sequential<Input<4>, Dense<5, Tanh>, Dense<3, Softmax>>;
using M = strata::Model<Net>;

strata::data::Dataset<> data() {
    auto f = lcg(40 * 4, 3, 0, 1);
    std::vector<std::int32_t> y(40);
    for (std::size_t i = 0; i < 40; ++i) y[i] = std::int32_t(i % 3);
    return strata::data::Dataset<>::from_arrays(std::vector<float>(f.begin(), f.end()), {4}, std::move(y)).batch(8);
}

// A trained model's checkpoint at `path`.
void trained_checkpoint(const std::string& path, strata::optim::Optimizer opt) {
    M m(1);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, opt);
    m.fit(data(), {.epochs = 2, .verbose = 0});
    m.save(path);
}

// A copy of checkpoint `from` at `to`, with `edit` applied to its tensors (name → values) and
// metadata before writing.
void rewrite(const std::string& from, const std::string& to,
             const std::function<void(std::vector<std::pair<std::string, std::vector<float>>>&, std::map<std::string, std::string>&)>& edit) {
    const auto f = strata::io::SafetensorsFile::load(from);
    std::vector<std::pair<std::string, std::vector<float>>> tensors;
    std::map<std::string, std::string> meta(f.metadata().begin(), f.metadata().end());
    std::map<std::string, std::vector<std::size_t>> shapes;
    for (const auto& n : f.names()) {
        tensors.emplace_back(n, f.get<float>(n));
        shapes[n] = f.shape(n);
    }
    edit(tensors, meta);
    strata::io::SafetensorsWriter w;
    for (const auto& [n, v] : tensors)
        w.add<float>(n, shapes.count(n) ? shapes[n] : std::vector<std::size_t>{v.size()}, std::span<const float>(v));
    for (const auto& [k, v] : meta) w.set_metadata(k, v);
    w.save(to);
}

}  // namespace

TEST_CASE("a checkpoint of another optimizer is refused (strict) and the model is unchanged; strict=false loads the weights") {
    strata_test::TempDir dir;
    const auto adam = (dir / "adam.safetensors").string();
    trained_checkpoint(adam, strata::optim::Adam{.learning_rate = 0.01});
    M m(7);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 0.01});
    m.fit(data(), {.epochs = 1, .verbose = 0});
    const auto before = m.get_weights();
    const auto msg = error_of<strata::CheckpointError>([&] { m.load(adam); });
    CHECK(has(msg, "Adam"));
    CHECK(has(msg, "RMSprop"));
    CHECK(m.get_weights() == before);  // nothing changed
    CHECK(m.epoch() == 1);

    m.load(adam, /*strict=*/false);
    M ref(1);
    ref.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    ref.load(adam);
    CHECK(m.get_weights() == ref.get_weights());
    CHECK(m.epoch() == 2);
}

TEST_CASE("unknown tensors: an error naming them (strict), ignored with strict=false") {
    strata_test::TempDir dir;
    const auto good = (dir / "good.safetensors").string(), extra = (dir / "extra.safetensors").string();
    trained_checkpoint(good, strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9});
    rewrite(good, extra, [](auto& tensors, auto&) { tensors.emplace_back("dense_9/kernel", std::vector<float>(6, 1.0f)); });
    M m(2);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9});
    const auto before = m.get_weights();
    CHECK(has(error_of<strata::CheckpointError>([&] { m.load(extra); }), "dense_9/kernel"));
    CHECK(m.get_weights() == before);
    m.load(extra, false);
    M ref(3);
    ref.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1, .momentum = 0.9});
    ref.load(good);
    CHECK(m.get_weights() == ref.get_weights());
}

TEST_CASE("a NaN or infinite value in a checkpoint is a CheckpointError naming the tensor and the index; nothing changes") {
    strata_test::TempDir dir;
    const auto good = (dir / "good.safetensors").string(), nan = (dir / "nan.safetensors").string(),
               inf = (dir / "inf.safetensors").string();
    trained_checkpoint(good, strata::optim::Adam{.learning_rate = 0.01});
    rewrite(good, nan, [](auto& tensors, auto&) {
        for (auto& [n, v] : tensors)
            if (n == "dense_1/kernel") v[7] = std::numeric_limits<float>::quiet_NaN();
    });
    rewrite(good, inf, [](auto& tensors, auto&) {
        for (auto& [n, v] : tensors)
            if (n == "optimizer/velocity/dense/bias") v[2] = -std::numeric_limits<float>::infinity();
    });
    M m(4);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    const auto before = m.get_weights();
    const auto msg = error_of<strata::CheckpointError>([&] { m.load(nan); });
    CHECK(has(msg, "'dense_1/kernel' holds nan at index 7"));
    CHECK(has(msg, "must be finite"));
    CHECK(has(error_of<strata::CheckpointError>([&] { m.load(inf); }), "'optimizer/velocity/dense/bias' holds -inf at index 2"));
    // Loaded without the optimizer's state (strict = false, uncompiled), the weights alone are checked too.
    M plain(5);
    CHECK(has(error_of<strata::CheckpointError>([&] { plain.load(nan, false); }), "dense_1/kernel"));
    CHECK(m.get_weights() == before);
    m.load(good);  // the intact file loads
}

TEST_CASE("TerminateOnNaN: a non-finite loss stops fit with a NumericError naming the epoch and batch; a NaN weight at the epoch's end is named") {
    // A NaN weight in the last layer makes the loss NaN at once.
    M m(6);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    auto w = m.get_weights();
    w.back() = std::numeric_limits<float>::quiet_NaN();
    m.set_weights(w);
    auto stop = std::make_shared<strata::train::TerminateOnNaN>();
    const auto msg = error_of<strata::NumericError>([&] { m.fit(data(), {.epochs = 2, .callbacks = {stop}, .verbose = 0}); });
    CHECK(has(msg, "the loss became nan at epoch 1, batch 1"));
    // Without the callback the same run goes on silently (what the callback is for).
    M quiet(6);
    quiet.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    quiet.set_weights(w);
    CHECK_NOTHROW(quiet.fit(data(), {.epochs = 1, .verbose = 0}));
    // A healthy run is not stopped.
    M ok(6);
    ok.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    CHECK_NOTHROW(ok.fit(data(), {.epochs = 2, .callbacks = {stop}, .verbose = 0}));
    // The weights are checked at the epoch's end: named by parameter and index.
    auto lambda = std::make_shared<strata::train::LambdaCallback>();
    lambda->epoch_end = [&](strata::train::TrainingContext& ctx, int, const strata::train::Logs&) {
        auto v = ctx.weights_snapshot();
        v[3] = std::numeric_limits<double>::infinity();  // dense/kernel, index 3
        ctx.restore_weights(v);
    };
    M late(6);
    late.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    CHECK(has(error_of<strata::NumericError>([&] { late.fit(data(), {.epochs = 2, .callbacks = {lambda, stop}, .verbose = 0}); }),
              "parameter 'dense/kernel', index 3 is inf after epoch 1"));
}

TEST_CASE("metadata integers are strict, and a bad one changes nothing") {
    strata_test::TempDir dir;
    const auto good = (dir / "good.safetensors").string();
    trained_checkpoint(good, strata::optim::SGD{.learning_rate = 0.1});
    M m(5);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    const auto before = m.get_weights();
    for (const char* bad : {"7x", "-1", "1e3", " 3", "99999999999999999999"}) {
        CAPTURE(bad);
        const auto path = (dir / "bad.safetensors").string();
        rewrite(good, path, [&](auto&, auto& meta) { meta["epoch"] = bad; });
        const auto msg = error_of<strata::CheckpointError>([&] { m.load(path); });
        CHECK(has(msg, "epoch"));
        CHECK(m.get_weights() == before);
        CHECK(m.epoch() == 0);
    }
}

TEST_CASE("the learning rate comes back: a constant one set by a callback, and a schedule through the iteration count") {
    strata_test::TempDir dir;
    const auto path = (dir / "lr.safetensors").string();
    {
        M m(1);
        m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
        m.fit(data(), {.epochs = 1, .verbose = 0});
        m.set_learning_rate(0.025);  // what ReduceLROnPlateau-like callbacks do
        m.save(path);
    }
    M m(2);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.1});
    m.load(path);
    CHECK(m.learning_rate() == doctest::Approx(0.025));

    const auto sched = (dir / "sched.safetensors").string();
    const strata::optim::ExponentialDecay decay{.initial_learning_rate = 0.1, .decay_steps = 5, .decay_rate = 0.5};
    double expected = 0;
    {
        M a(1);
        a.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = decay});
        a.fit(data(), {.epochs = 2, .verbose = 0});  // 10 steps
        expected = a.learning_rate();
        a.save(sched);
    }
    M b(2);
    b.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = decay});
    CHECK(b.learning_rate() == doctest::Approx(0.1));
    b.load(sched);
    CHECK(b.learning_rate() == doctest::Approx(expected));
    CHECK(expected < 0.05);  // the schedule did move
}
