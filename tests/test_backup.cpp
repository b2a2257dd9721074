// BackupAndRestore (strata/train/backup.hpp): a fit interrupted mid-epoch or at an epoch end,
// then resumed by a new Model with the same callback, ends bitwise equal to an uninterrupted
// one (weights and optimizer slots) and runs only the remaining batches; the backup is removed
// at the end unless kept; bad backups and directories are clear errors, never a silent restart.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>
#include <strata/train/tensorboard.hpp>  // opt-in: not part of strata.hpp

using namespace strata::nn;
namespace fs = std::filesystem;
namespace tr = strata::train;
using strata_test::TempDir;
using strata_test::lcg;

namespace {

// Dropout makes the step counter matter (its masks are drawn from it); Adam makes the slots
// and the iteration count matter.
// Batch normalization's moving statistics (variables that are not trained) must resume bitwise too.
using Net = Sequential<Input<4>, Dense<16, Linear>, BatchNormalization<BatchNormOptions{.momentum = 0.9}>, ActivationLayer<Tanh>,
                       Dropout<25>, Dense<3, Softmax>>;
using Other = Sequential<Input<4>, Dense<8, Tanh>, Dropout<25>, Dense<3, Softmax>>;
constexpr std::uint64_t seed = 7;
constexpr std::int64_t batches_per_epoch = 10;

strata::data::Dataset<> blobs() {
    const std::size_t n = 240;
    auto f = lcg(n * 4, 3);
    std::vector<float> x(f.begin(), f.end());
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        const double a = f[i * 4] + 0.5 * f[i * 4 + 1], b = f[i * 4 + 2] - f[i * 4 + 3];
        y[i] = a > 0 ? (b > 0 ? 2 : 1) : 0;
    }
    // Shuffled per epoch: resuming must find the epoch's own order again.
    return strata::data::Dataset<>::from_arrays(std::move(x), {4}, std::move(y)).shuffle(100, 9).batch(24);
}

// Counts the batches fit trains on; at `at` (counted from 1, across epochs) it throws (a crash:
// on_train_end never runs) or sets stop_training (a clean stop, as StopOnSignal does).
struct Interrupt : tr::Callback {
    enum Kind { None, Throw, Stop, ThrowAtEpochBegin };
    Kind kind = None;
    std::int64_t at = 0;
    std::int64_t batches = 0;
    Interrupt(Kind k, std::int64_t a) : kind(k), at(a) {}
    void on_train_batch_end(tr::TrainingContext& ctx, std::int64_t, const tr::Logs&) override {
        ++batches;
        if (batches != at) return;
        if (kind == Throw) throw std::runtime_error("simulated crash");
        if (kind == Stop) ctx.stop_training = true;
    }
    void on_epoch_begin(tr::TrainingContext&, int epoch) override {
        if (kind == ThrowAtEpochBegin && epoch == at) throw std::runtime_error("simulated crash at epoch begin");
    }
};

template <class Strategy>
struct Run {
    Strategy strategy;
    strata::Model<Net, Strategy> model;
    template <class... A>
    explicit Run(A&&... a) : strategy(std::forward<A>(a)...), model(strategy, seed) {
        model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    }
    tr::History fit(int epochs, tr::CallbackList callbacks) {
        return model.fit(blobs(), {.epochs = epochs, .callbacks = std::move(callbacks), .verbose = 0});
    }
    auto slots() const { return model.gradient_path().slots(); }
};

template <class Strategy, class... A>
void check_mid_epoch_resume(Interrupt::Kind kind, A... strategy_args) {
    constexpr int epochs = 3;
    constexpr std::int64_t every = 3, interrupt_at = 14;
    Run<Strategy> straight(strategy_args...);
    const auto full = straight.fit(epochs, {});

    TempDir dir("strata_backup");
    auto backup = std::make_shared<tr::BackupAndRestore>(dir.path, tr::BackupOptions{.save_every_steps = every});
    {
        Run<Strategy> first(strategy_args...);
        auto stop = std::make_shared<Interrupt>(kind, interrupt_at);
        if (kind == Interrupt::Throw) CHECK_THROWS_WITH(first.fit(epochs, {backup, stop}), "simulated crash");
        else first.fit(epochs, {backup, stop});
        CHECK(stop->batches == interrupt_at);
        REQUIRE(fs::exists(backup->file()));
    }
    // A crash resumes from the last periodic backup (batch 12 = epoch 1, batch 2); a clean stop
    // backs up where it stopped (batch 14 = epoch 1, batch 4).
    const std::int64_t resume_at = kind == Interrupt::Throw ? interrupt_at / every * every : interrupt_at;
    const auto pos = tr::BackupAndRestore::read_position(backup->file());
    CHECK(pos.epoch == int(resume_at / batches_per_epoch));
    CHECK(pos.batches == resume_at % batches_per_epoch);
    CHECK(pos.seen == pos.batches * 24);
    CHECK(pos.counted == double(pos.seen));  // the accuracy counts examples (no token mask)

    Run<Strategy> second(strategy_args...);
    auto count = std::make_shared<Interrupt>(Interrupt::None, 0);
    const auto resumed = second.fit(epochs, {backup, count});
    REQUIRE(backup->restored());
    CHECK(*backup->restored() == pos);
    CHECK(count->batches == epochs * batches_per_epoch - resume_at);  // only the remaining work
    CHECK(second.model.get_weights() == straight.model.get_weights());
    CHECK(second.slots() == straight.slots());
    CHECK(second.model.gradient_path().iterations() == straight.model.gradient_path().iterations());
    CHECK(second.model.epoch() == epochs);
    // The resumed epoch reports the figures of the uninterrupted one.
    REQUIRE(resumed.epoch == std::vector<int>{1, 2});
    CHECK(resumed["loss"][0] == full["loss"][1]);
    CHECK(resumed["accuracy"][0] == full["accuracy"][1]);
    CHECK(resumed["loss"][1] == full["loss"][2]);
    CHECK_FALSE(fs::exists(backup->file()));  // done: removed
}

}  // namespace

TEST_CASE("BackupAndRestore: a crash mid-epoch resumes bitwise from the last periodic backup") {
    check_mid_epoch_resume<strata::distribute::Default>(Interrupt::Throw);
}

TEST_CASE("BackupAndRestore: a clean stop mid-epoch backs up where it stopped and resumes there") {
    check_mid_epoch_resume<strata::distribute::Default>(Interrupt::Stop);
}

TEST_CASE("BackupAndRestore under Mirrored<>(2): crash and stop mid-epoch resume bitwise") {
    check_mid_epoch_resume<strata::distribute::Mirrored<>>(Interrupt::Throw, 2);
    check_mid_epoch_resume<strata::distribute::Mirrored<>>(Interrupt::Stop, 2);
}

TEST_CASE("BackupAndRestore: interrupted at epoch 4 of 10, the resumed fit runs exactly 6 epochs (Keras's doctest)") {
    Run<strata::distribute::Default> straight;
    straight.fit(10, {});

    TempDir dir("strata_backup");
    auto backup = std::make_shared<tr::BackupAndRestore>(dir.path);
    {
        Run<strata::distribute::Default> first;
        CHECK_THROWS(first.fit(10, {backup, std::make_shared<Interrupt>(Interrupt::ThrowAtEpochBegin, 4)}));
        CHECK(backup->backups_written() == 4);
    }
    const auto pos = tr::BackupAndRestore::read_position(backup->file());
    CHECK(pos == tr::TrainingPosition{4, 0, 0, 0, 0});

    Run<strata::distribute::Default> second;
    auto count = std::make_shared<Interrupt>(Interrupt::None, 0);
    const auto history = second.fit(10, {backup, count});
    CHECK(history.epoch.size() == 6);
    CHECK(history.epoch.front() == 4);
    CHECK(count->batches == 6 * batches_per_epoch);
    CHECK(second.model.get_weights() == straight.model.get_weights());
    CHECK(second.slots() == straight.slots());
    CHECK_FALSE(fs::exists(backup->file()));
}

TEST_CASE("BackupAndRestore: removed at the end unless delete_at_end = false; a kept backup resumes at the end") {
    TempDir dir("strata_backup");
    {
        auto backup = std::make_shared<tr::BackupAndRestore>(dir.path);
        Run<strata::distribute::Default> run;
        run.fit(2, {backup});
        CHECK(backup->backups_written() == 2);
        CHECK_FALSE(fs::exists(backup->file()));
        CHECK(dir.entries().empty());  // no temporary or probe file left either
    }
    auto keep = std::make_shared<tr::BackupAndRestore>(dir.path, tr::BackupOptions{.delete_at_end = false});
    Run<strata::distribute::Default> run;
    run.fit(2, {keep});
    REQUIRE(fs::exists(keep->file()));
    // Run again: everything is done already, as in Keras.
    Run<strata::distribute::Default> again;
    auto count = std::make_shared<Interrupt>(Interrupt::None, 0);
    const auto history = again.fit(2, {keep, count});
    CHECK(count->batches == 0);
    CHECK(history.epoch.empty());
    CHECK(again.model.get_weights() == run.model.get_weights());
    CHECK(again.model.epoch() == 2);
}

TEST_CASE("BackupAndRestore: a backup of another model or optimizer is refused, the model left as it was") {
    TempDir dir("strata_backup");
    auto keep = std::make_shared<tr::BackupAndRestore>(dir.path, tr::BackupOptions{.delete_at_end = false});
    Run<strata::distribute::Default>().fit(1, {keep});
    REQUIRE(fs::exists(keep->file()));

    strata::Model<Other> other(seed);
    other.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    const auto before = other.get_weights();
    const auto msg = strata_test::error_of<strata::CheckpointError>(
        [&] { other.fit(blobs(), {.epochs = 2, .callbacks = {keep}, .verbose = 0}); });
    CHECK(msg.find("dense/kernel") != std::string::npos);
    CHECK(msg.find(keep->file().string()) != std::string::npos);
    CHECK(other.get_weights() == before);

    strata::Model<Net> rms(seed);
    rms.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{});
    const auto msg2 = strata_test::error_of<strata::CheckpointError>(
        [&] { rms.fit(blobs(), {.epochs = 2, .callbacks = {keep}, .verbose = 0}); });
    CHECK(msg2.find("Adam") != std::string::npos);
    CHECK(msg2.find("RMSprop") != std::string::npos);
}

TEST_CASE("BackupAndRestore: a corrupt or foreign backup is an error naming the file, never a silent restart") {
    TempDir dir("strata_backup");
    auto backup = std::make_shared<tr::BackupAndRestore>(dir.path);
    const auto file = backup->file();
    auto fit = [&] {
        Run<strata::distribute::Default> run;
        run.fit(2, {backup});
    };
    auto write = [&](const std::string& bytes) {
        std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
    };

    write("this is not a safetensors file");
    auto msg = strata_test::error_of<strata::CheckpointError>(fit);
    CHECK(msg.find(file.string()) != std::string::npos);
    CHECK(msg.find("corrupt") != std::string::npos);
    CHECK(fs::exists(file));  // left for the user to look at

    // A valid backup cut short (a copy that died half-way, a full disk elsewhere).
    {
        auto keep = std::make_shared<tr::BackupAndRestore>(dir.path, tr::BackupOptions{.delete_at_end = false});
        fs::remove(file);
        Run<strata::distribute::Default>().fit(1, {keep});
    }
    std::string bytes;
    {
        std::ifstream in(file, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    write(bytes.substr(0, bytes.size() / 2));
    msg = strata_test::error_of<strata::CheckpointError>(fit);
    CHECK(msg.find(file.string()) != std::string::npos);
    CHECK(msg.find("corrupt") != std::string::npos);

    // A plain checkpoint is not a backup: it holds no position.
    {
        Run<strata::distribute::Default> run;
        run.model.save(file.string());
    }
    msg = strata_test::error_of<strata::CheckpointError>(fit);
    CHECK(msg.find("not a backup") != std::string::npos);
    CHECK(msg.find("backup_format") != std::string::npos);

    // A backup whose position does not parse.
    {
        Run<strata::distribute::Default> run;
        run.model.save(file.string(), {{"backup_format", "strata-backup"}, {"backup_version", "1"}, {"backup_epoch", "0"},
                                       {"backup_batches", "-3"}, {"backup_loss_sum", "0"}, {"backup_correct", "0"},
                                       {"backup_seen", "0"}});
    }
    msg = strata_test::error_of<strata::CheckpointError>(fit);
    CHECK(msg.find("backup_batches") != std::string::npos);
    CHECK(msg.find(file.string()) != std::string::npos);
    // The accuracy's count (backup_counted), negative or not a number.
    for (const char* bad : {"-1", "twelve"}) {
        {
            Run<strata::distribute::Default> run;
            run.model.save(file.string(), {{"backup_format", "strata-backup"}, {"backup_version", "1"}, {"backup_epoch", "0"},
                                           {"backup_batches", "1"}, {"backup_loss_sum", "0"}, {"backup_correct", "0"},
                                           {"backup_counted", bad}, {"backup_seen", "24"}});
        }
        msg = strata_test::error_of<strata::CheckpointError>(fit);
        CHECK(msg.find("backup_counted") != std::string::npos);
        CHECK(msg.find(bad) != std::string::npos);
        CHECK(msg.find(file.string()) != std::string::npos);
    }
    // Written before backup_counted was kept: the accuracy counted the examples.
    {
        Run<strata::distribute::Default> run;
        run.model.save(file.string(), {{"backup_format", "strata-backup"}, {"backup_version", "1"}, {"backup_epoch", "0"},
                                       {"backup_batches", "1"}, {"backup_loss_sum", "0.5"}, {"backup_correct", "20"},
                                       {"backup_seen", "24"}});
    }
    CHECK(tr::BackupAndRestore::read_position(file) == tr::TrainingPosition{0, 1, 0.5, 20, 24, 24});

    // A position past the end of the epoch's data: the data changed since.
    {
        Run<strata::distribute::Default> run;
        run.model.save(file.string(), {{"backup_format", "strata-backup"}, {"backup_version", "1"}, {"backup_epoch", "0"},
                                       {"backup_batches", "11"}, {"backup_loss_sum", "0"}, {"backup_correct", "0"},
                                       {"backup_seen", "264"}});
    }
    msg = strata_test::error_of<strata::ValueError>(fit);
    CHECK(msg.find("only 10 batches") != std::string::npos);

    // Unreadable: a directory where the file should be.
    fs::remove(file);
    fs::create_directories(file);
    msg = strata_test::error_of<strata::IoError>(fit);
    CHECK(msg.find(file.string()) != std::string::npos);
}

TEST_CASE("BackupAndRestore: a directory that cannot be written is an IoError naming it, at the start of fit") {
    TempDir dir("strata_backup");
    std::ofstream(dir / "file") << "x";
    for (const auto& bad : {dir / "file", dir / "file" / "sub"}) {
        auto backup = std::make_shared<tr::BackupAndRestore>(bad);
        Run<strata::distribute::Default> run;
        auto count = std::make_shared<Interrupt>(Interrupt::None, 0);
        const auto msg = strata_test::error_of<strata::IoError>([&] { run.fit(1, {backup, count}); });
        CHECK(msg.find(bad.string()) != std::string::npos);
        CHECK(count->batches == 0);
    }
    if (::geteuid() != 0) {  // root writes anywhere
        const auto ro = dir / "read_only";
        fs::create_directories(ro);
        fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
        auto backup = std::make_shared<tr::BackupAndRestore>(ro);
        Run<strata::distribute::Default> run;
        const auto msg = strata_test::error_of<strata::IoError>([&] { run.fit(1, {backup}); });
        CHECK(msg.find("not writable") != std::string::npos);
        CHECK(msg.find(ro.string()) != std::string::npos);
    }
    CHECK_THROWS_AS(tr::BackupAndRestore(dir.path, {.save_every_steps = -1}), strata::ValueError);
}

namespace {
// A worker of a multi-process job: trains, restores, writes nothing.
struct Worker : strata::Model<Net> {
    using strata::Model<Net>::Model;
    bool is_chief() const override { return false; }
};
}  // namespace

TEST_CASE("only the chief writes: backups, checkpoints, CSV logs and TensorBoard files") {
    TempDir dir("strata_backup");
    auto backup = std::make_shared<tr::BackupAndRestore>(dir / "backup", tr::BackupOptions{.save_every_steps = 1});
    auto ckpt = std::make_shared<tr::ModelCheckpoint>((dir / "ckpt-{epoch}.safetensors").string(),
                                                      tr::ModelCheckpoint::Options{.monitor = "loss"});
    auto csv = std::make_shared<tr::CsvLogger>((dir / "log.csv").string());
    auto tb = std::make_shared<tr::TensorBoard>(dir / "tb");
    Worker worker(seed);
    worker.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    worker.fit(blobs(), {.epochs = 2, .callbacks = {backup, ckpt, csv, tb}, .verbose = 0});
    CHECK(backup->backups_written() == 0);
    CHECK(ckpt->saved() == 0);
    CHECK(tb->files().empty());
    CHECK(!fs::exists(dir / "log.csv"));
    CHECK(!fs::exists(dir / "tb"));
    CHECK(!fs::exists(backup->file()));

    // Every rank restores what the chief wrote.
    auto keep = std::make_shared<tr::BackupAndRestore>(dir / "backup", tr::BackupOptions{.delete_at_end = false});
    Run<strata::distribute::Default> chief;
    chief.fit(1, {keep});
    Worker restored(seed + 1);
    restored.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    restored.fit(blobs(), {.epochs = 1, .callbacks = {keep}, .verbose = 0});
    CHECK(restored.get_weights() == chief.model.get_weights());
}

TEST_CASE("BackupAndRestore under ParameterServer: resumes at an epoch end, refuses a mid-epoch position") {
    using PS = strata::distribute::ParameterServer<strata::place::Host, strata::sync::Synchronous>;
    auto make = [](PS& ps) {
        auto m = std::make_unique<strata::Model<Net, PS>>(ps, seed);
        m->compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
        return m;
    };
    PS ps_straight(2, 1);
    auto straight = make(ps_straight);
    straight->fit(blobs(), {.epochs = 3, .verbose = 0});

    TempDir dir("strata_backup");
    auto backup = std::make_shared<tr::BackupAndRestore>(dir.path);
    {
        PS ps(2, 1);
        auto first = make(ps);
        CHECK_THROWS(first->fit(blobs(), {.epochs = 3,
                                          .callbacks = {backup, std::make_shared<Interrupt>(Interrupt::ThrowAtEpochBegin, 2)},
                                          .verbose = 0}));
    }
    PS ps(2, 1);
    auto second = make(ps);
    const auto history = second->fit(blobs(), {.epochs = 3, .callbacks = {backup}, .verbose = 0});
    CHECK(history.epoch == std::vector<int>{2});
    CHECK(second->get_weights() == straight->get_weights());

    // A position inside an epoch has no meaning here: refused, naming the strategy.
    second->save(backup->file().string(), {{"backup_format", "strata-backup"}, {"backup_version", "1"}, {"backup_epoch", "1"},
                                           {"backup_batches", "2"}, {"backup_loss_sum", "1.5"}, {"backup_correct", "3"},
                                           {"backup_seen", "48"}});
    PS ps3(2, 1);
    auto third = make(ps3);
    const auto msg = strata_test::error_of<strata::ValueError>(
        [&] { third->fit(blobs(), {.epochs = 3, .callbacks = {backup}, .verbose = 0}); });
    CHECK(msg.find("ParameterServer") != std::string::npos);
}

TEST_CASE("BackupAndRestore: a backup of another configuration is refused naming each key, unless allowed") {
    TempDir dir("strata_backup");
    const std::map<std::string, std::string> made{{"batch size", "128"}, {"seed", "42"}, {"strategy", "mirrored"}};
    auto keep = std::make_shared<tr::BackupAndRestore>(dir.path, tr::BackupOptions{.delete_at_end = false, .config = made});
    Run<strata::distribute::Default> first;
    first.fit(1, {keep});
    REQUIRE(fs::exists(keep->file()));
    CHECK(tr::BackupAndRestore::read_config(keep->file()) == made);

    auto other = std::make_shared<tr::BackupAndRestore>(
        dir.path, tr::BackupOptions{.delete_at_end = false, .config = {{"batch size", "64"}, {"seed", "7"}, {"strategy", "mirrored"}}});
    Run<strata::distribute::Default> second;
    const auto before = second.model.get_weights();
    auto count = std::make_shared<Interrupt>(Interrupt::None, 0);
    const auto msg = strata_test::error_of<strata::CheckpointError>([&] { second.fit(2, {other, count}); });
    CHECK(msg.find(keep->file().string()) != std::string::npos);
    CHECK(msg.find("batch size: the backup has 128, this run 64") != std::string::npos);
    CHECK(msg.find("seed: the backup has 42, this run 7") != std::string::npos);
    CHECK(msg.find("strategy") == std::string::npos);  // the same: not named
    CHECK(msg.find("allow_config_change") != std::string::npos);
    CHECK(count->batches == 0);
    CHECK(second.model.get_weights() == before);
    // A key only one side has differs too.
    auto fewer = std::make_shared<tr::BackupAndRestore>(dir.path, tr::BackupOptions{.config = {{"batch size", "128"}}});
    const auto msg2 = strata_test::error_of<strata::CheckpointError>([&] { Run<strata::distribute::Default>().fit(2, {fewer}); });
    CHECK(msg2.find("seed: the backup has 42, this run (not set)") != std::string::npos);

    // Allowed: resumed, and the backups from then on carry the new configuration.
    auto forced = std::make_shared<tr::BackupAndRestore>(
        dir.path, tr::BackupOptions{.delete_at_end = false, .config = {{"batch size", "64"}, {"seed", "7"}}, .allow_config_change = true});
    Run<strata::distribute::Default> third;
    third.fit(2, {forced, count});
    REQUIRE(forced->restored());
    CHECK(forced->restored()->epoch == 1);
    CHECK(count->batches == batches_per_epoch);  // only the second epoch
    CHECK(tr::BackupAndRestore::read_config(forced->file()) == std::map<std::string, std::string>{{"batch size", "64"}, {"seed", "7"}});
    // The same configuration resumes without a word.
    Run<strata::distribute::Default> fourth;
    auto same = std::make_shared<tr::BackupAndRestore>(dir.path, tr::BackupOptions{.config = {{"batch size", "64"}, {"seed", "7"}}});
    fourth.fit(2, {same});
    CHECK(same->restored());
}

// Issue 41: a backup taken at batch 7 of an epoch, resumed (allow_config_change) by a run of 5
// steps per epoch, was counted as a finished epoch ("7/5") instead of the ValueError
// docs/fault_tolerance.md promises.
TEST_CASE("BackupAndRestore: a backup with more batches done than this run's steps_per_epoch is a ValueError") {
    TempDir dir("strata_backup");
    const std::map<std::string, std::string> seven{{"steps per epoch", "7"}}, five{{"steps per epoch", "5"}};
    {
        Run<strata::distribute::Default> first;
        auto backup = std::make_shared<tr::BackupAndRestore>(dir.path, tr::BackupOptions{.save_every_steps = 7, .config = seven});
        auto stop = std::make_shared<Interrupt>(Interrupt::Stop, 7);
        first.model.fit(blobs(), {.epochs = 3, .steps_per_epoch = 8, .callbacks = {backup, stop}, .verbose = 0});
        REQUIRE(tr::BackupAndRestore::read_position(backup->file()).batches == 7);
    }
    SUBCASE("fewer steps per epoch: refused, naming both counts") {
        Run<strata::distribute::Default> second;
        auto backup = std::make_shared<tr::BackupAndRestore>(
            dir.path, tr::BackupOptions{.save_every_steps = 5, .config = five, .allow_config_change = true});
        auto count = std::make_shared<Interrupt>(Interrupt::None, 0);
        const auto msg = strata_test::error_of<strata::ValueError>(
            [&] { second.model.fit(blobs(), {.epochs = 3, .steps_per_epoch = 5, .callbacks = {backup, count}, .verbose = 0}); });
        CHECK(strata_test::has(msg, "expected at most steps_per_epoch = 5 batches done in an epoch, found 7"));
        CHECK(count->batches == 0);
    }
    SUBCASE("the negative control: as many steps per epoch as were done resumes") {
        Run<strata::distribute::Default> second;
        auto backup = std::make_shared<tr::BackupAndRestore>(
            dir.path, tr::BackupOptions{.save_every_steps = 7, .config = seven, .allow_config_change = true});
        auto count = std::make_shared<Interrupt>(Interrupt::None, 0);
        second.model.fit(blobs(), {.epochs = 3, .steps_per_epoch = 7, .callbacks = {backup, count}, .verbose = 0});
        CHECK(count->batches == 2 * 7);  // epoch 0 was done at the backup; epochs 1 and 2 remain
    }
}

TEST_CASE("BackupAndRestore: a second live run on one backup directory is refused, naming the process that holds it") {
    TempDir dir("strata_backup");
    auto first = std::make_shared<tr::BackupAndRestore>(dir.path);
    std::string msg;
    auto intruder = std::make_shared<tr::LambdaCallback>();
    intruder->batch_end = [&](tr::TrainingContext&, std::int64_t step, const tr::Logs&) {
        if (step != 2) return;
        CHECK(fs::exists(first->lock_file()));
        auto second = std::make_shared<tr::BackupAndRestore>(dir.path);
        Run<strata::distribute::Default> run;
        auto count = std::make_shared<Interrupt>(Interrupt::None, 0);
        msg = strata_test::error_of<strata::IoError>([&] { run.fit(1, {second, count}); });
        CHECK(count->batches == 0);
    };
    Run<strata::distribute::Default> run;
    run.fit(1, {first, intruder});
    CHECK(msg.find(dir.path.string()) != std::string::npos);
    CHECK(msg.find("in use by another run (process " + std::to_string(::getpid())) != std::string::npos);
    CHECK(dir.entries().empty());  // the first run ended: no backup, no lock left
    // Released at the end: the next run takes the directory.
    auto next = std::make_shared<tr::BackupAndRestore>(dir.path);
    Run<strata::distribute::Default>().fit(1, {next});
    CHECK(next->backups_written() == 1);
}

TEST_CASE("BackupAndRestore: a dangling backup link is an error naming it, never a fresh start") {
    TempDir dir("strata_backup");
    auto backup = std::make_shared<tr::BackupAndRestore>(dir.path);
    fs::create_directories(dir.path);
    fs::create_symlink(dir / "moved-away.safetensors", backup->file());
    Run<strata::distribute::Default> run;
    auto count = std::make_shared<Interrupt>(Interrupt::None, 0);
    const auto msg = strata_test::error_of<strata::CheckpointError>([&] { run.fit(1, {backup, count}); });
    CHECK(msg.find(backup->file().string()) != std::string::npos);
    CHECK(msg.find("symbolic link to '" + (dir / "moved-away.safetensors").string() + "', which does not exist") != std::string::npos);
    CHECK(count->batches == 0);
    CHECK(fs::is_symlink(backup->file()));  // left for the user to look at
}
