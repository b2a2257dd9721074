// Keras-style callbacks during fit (history, CSV log, checkpoints, early stopping, the
// learning-rate scheduler, a user's own), ModelCheckpoint's file names and the progress bar.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <strata/strata.hpp>

#include "training_util.hpp"

using namespace strata::nn;
using strata_test::blobs;
using strata_test::Small;
using strata_test::temp_path;
namespace fs = std::filesystem;

TEST_CASE("callbacks: history, CSV log, checkpoints, early stopping, LR schedule, user callback") {
    const auto csv = temp_path("log.csv");
    const auto ckpt = temp_path("ckpt_{epoch:02d}.safetensors");
    const auto named = temp_path("w-{epoch}-{val_accuracy:.4f}.safetensors");
    strata::Model<Small> model(3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
    auto stopper = std::make_shared<strata::train::EarlyStopping>(
        strata::train::EarlyStopping::Options{.monitor = "loss", .min_delta = 10.0, .patience = 2});
    auto saver = std::make_shared<strata::train::ModelCheckpoint>(ckpt);
    auto namer = std::make_shared<strata::train::ModelCheckpoint>(named);
    std::vector<double> lrs;
    auto sched = std::make_shared<strata::train::LearningRateScheduler>([](int epoch, double lr) { return epoch == 0 ? lr : lr * 0.5; });
    int batches = 0;
    auto user = std::make_shared<strata::train::LambdaCallback>();
    user->batch_end = [&](strata::train::TrainingContext&, std::int64_t, const strata::train::Logs& l) {
        ++batches;
        CHECK(l.contains("loss"));
    };
    user->epoch_end = [&](strata::train::TrainingContext& c, int, const strata::train::Logs&) { lrs.push_back(c.learning_rate()); };
    auto h = model.fit(blobs(64, 8).batch(16), {.epochs = 10,
                                                .validation_data = blobs(32, 9).batch(16),
                                                .callbacks = {std::make_shared<strata::train::CsvLogger>(csv), stopper, saver, namer, sched, user},
                                                .verbose = 0});
    // min_delta 10 can never be met: stops after patience epochs (the first epoch sets the best).
    CHECK(h.epoch.size() == 3);
    CHECK(stopper->stopped_epoch() == 2);
    CHECK(batches == 3 * 4);
    REQUIRE(lrs.size() == 3);
    CHECK(lrs[1] == doctest::Approx(0.025));
    CHECK(lrs[2] == doctest::Approx(0.0125));
    CHECK(h["val_loss"].size() == 3);
    CHECK(saver->saved() == 3);
    CHECK(fs::exists(temp_path("ckpt_03.safetensors")));
    for (int e = 0; e < 3; ++e) {  // Keras's names: the epoch as is, the figure with 4 decimals
        char want[64];
        std::snprintf(want, sizeof want, "w-%d-%.4f.safetensors", e + 1, h["val_accuracy"][std::size_t(e)]);
        CHECK(fs::exists(temp_path(want)));
        fs::remove(temp_path(want));
    }
    std::ifstream in(csv);
    std::string header, line;
    std::getline(in, header);
    CHECK(header.find("epoch,loss,accuracy,val_loss,val_accuracy,lr") == 0);
    int rows = 0;
    while (std::getline(in, line)) ++rows;
    CHECK(rows == 3);
    for (int e = 1; e <= 3; ++e) fs::remove(temp_path("ckpt_0" + std::to_string(e) + ".safetensors"));
    fs::remove(csv);
}

TEST_CASE("ModelCheckpoint paths are filled as Python's str.format fills Keras's") {
    using strata::train::format_filepath;
    strata::train::Logs logs;
    logs.set("loss", 0.123456789);
    logs.set("val_accuracy", 0.98125);
    logs.set("lr", 1e-5);
    logs.set("updates", 100);
    logs.set("val_loss", -2.5);
    // Expected strings are Python's: "{epoch:02d}".format(epoch=3), etc.
    CHECK(format_filepath("w-{epoch:02d}-{val_accuracy:.4f}.safetensors", 2, logs) == "w-03-0.9812.safetensors");
    CHECK(format_filepath("ckpt-{epoch}.st", 11, logs) == "ckpt-12.st");
    CHECK(format_filepath("{epoch:03}", 0, logs) == "001");
    CHECK(format_filepath("{loss}", 0, logs) == "0.123456789");
    CHECK(format_filepath("{lr}", 0, logs) == "1e-05");
    CHECK(format_filepath("{updates}", 0, logs) == "100.0");
    CHECK(format_filepath("{updates:d}", 0, logs) == "100");
    CHECK(format_filepath("{loss:e}", 0, logs) == "1.234568e-01");
    CHECK(format_filepath("{loss:.2E}", 0, logs) == "1.23E-01");
    CHECK(format_filepath("{lr:g}|{loss:.3g}", 0, logs) == "1e-05|0.123");
    CHECK(format_filepath("{val_accuracy:.1%}", 0, logs) == "98.1%");
    CHECK(format_filepath("{val_loss:.2f}|{val_loss:+.1f}|{loss:+.1f}|{loss: .1f}", 0, logs) == "-2.50|-2.5|+0.1| 0.1");
    CHECK(format_filepath("{val_loss:08.3f}|{epoch:>4}|{epoch:<4}|{epoch:*^5}", 6, logs) == "-002.500|   7|7   |**7**");
    CHECK(format_filepath("{{epoch}}-{{{epoch}}}-}}{{", 0, logs) == "{epoch}-{1}-}{");
    CHECK(format_filepath("no fields.safetensors", 0, logs) == "no fields.safetensors");

    using strata::ValueError;
    CHECK_THROWS_WITH_AS(format_filepath("w-{val_acc:.4f}", 0, logs),
                         "format: 'w-{val_acc:.4f}' names 'val_acc', which is not a figure of this epoch (available: epoch, "
                         "loss, val_accuracy, lr, updates, val_loss)",
                         ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("w-{}", 0, logs), doctest::Contains("names '', which is not a figure"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("w-{loss:.4q}", 0, logs),
                         doctest::Contains("bad format spec '.4q' for 'loss' in 'w-{loss:.4q}': unknown or unsupported type"),
                         ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("{loss:.}", 0, logs), doctest::Contains("'.' without a precision"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("{loss:,.2f}", 0, logs), doctest::Contains("bad format spec ',.2f'"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("{epoch:.2d}", 0, logs), doctest::Contains("a precision is not allowed"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("{loss:d}", 0, logs), doctest::Contains("'loss' is 0.123457, not an integer"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("w-{epoch", 0, logs), doctest::Contains("is not closed (write '{{' for a brace)"), ValueError);
    CHECK_THROWS_WITH_AS(format_filepath("w-}", 0, logs), doctest::Contains("a single '}' at position 2"), ValueError);

    // In fit: a path naming a figure that training does not produce fails at the first epoch.
    strata::Model<Small> model(3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::SGD{.learning_rate = 0.05});
    auto bad = std::make_shared<strata::train::ModelCheckpoint>(temp_path("w-{val_accuracy:.4f}.safetensors"));
    CHECK_THROWS_WITH_AS(model.fit(blobs(32, 8).batch(16), {.epochs = 2, .callbacks = {bad}, .verbose = 0}),
                         doctest::Contains("names 'val_accuracy', which is not a figure of this epoch (available: epoch, loss, accuracy"),
                         ValueError);
    CHECK(bad->saved() == 0);
}

TEST_CASE("the progress bar prints small learning rates and counts readably") {
    auto fmt = [](const char* name, double v) {
        char buf[40];
        strata::train::format_figure(buf, sizeof buf, name, v);
        return std::string(buf);
    };
    CHECK(fmt("lr", 1e-5) == "1.0000e-05");  // not 0.0000
    CHECK(fmt("lr", 0.001) == "0.0010");
    CHECK(fmt("lr", 0.00099) == "9.9000e-04");
    CHECK(fmt("lr", 0.05) == "0.0500");
    CHECK(fmt("loss", 0.04213) == "0.0421");
    CHECK(fmt("loss", 2.5e-6) == "2.5000e-06");
    CHECK(fmt("val_loss", 0.0) == "0.0000");
    CHECK(fmt("accuracy", 1.0) == "1.0000");  // a rate keeps its decimals when it is whole
    CHECK(fmt("val_accuracy", 0.0) == "0.0000");
    CHECK(fmt("loss", std::nan("")) == "nan");
    CHECK(fmt("updates", 100) == "100");
    CHECK(fmt("dropped", 0) == "0");
    CHECK(fmt("staleness_mean", 1.25) == "1.2500");
    CHECK(fmt("seconds", 12.0) == "12");

    // The line of an epoch (verbose 2, written to a file: no terminal control characters).
    const auto path = temp_path("progress.txt");
    std::FILE* f = std::fopen(path.c_str(), "w+");
    REQUIRE(f != nullptr);
    strata::train::ProgressBar bar(2, f);
    strata::train::Logs logs;
    logs.set("loss", 0.5);
    logs.set("lr", 1e-5);
    logs.set("updates", 100);
    bar.epoch_begin(0, 3, 10);
    bar.epoch_end(10, logs);
    std::fclose(f);
    std::ifstream in(path);
    std::string epoch_line, line;
    std::getline(in, epoch_line);
    std::getline(in, line);
    CHECK(epoch_line == "Epoch 1/3");
    INFO(line);
    CHECK(line.find("10/10 - ") == 0);
    CHECK(strata_test::has(line, " - loss: 0.5000 - lr: 1.0000e-05 - updates: 100"));
    fs::remove(path);
}
