#pragma once
/// \file strata/train/fit_loop.hpp
/// The part of `Model::fit` that does not depend on the network, the strategy, the element
/// type or the label type: epochs, callbacks, the progress bar, logs, history, and resuming
/// from a backup. It is written once, without templates, and drives the model through a
/// small interface (`FitDriver`) that `Model` implements for its Net × Strategy. So a program
/// that trains several models compiles this loop once, not once per model.

#include <cstdint>
#include <optional>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/train/callbacks.hpp"
#include "strata/train/progress.hpp"

namespace strata::train {

/// What fit does with one epoch's updates: the running figures, the progress bar and the
/// callbacks after every step. Model's epoch runner calls step() after each update.
class FitEpoch {
public:
    FitEpoch(TrainingContext& ctx, const CallbackList& callbacks, ProgressBar& bar, Logs& logs, bool accuracy,
             std::int64_t steps_per_epoch)
        : ctx_(&ctx), callbacks_(&callbacks), bar_(&bar), logs_(&logs), accuracy_(accuracy), steps_per_epoch_(steps_per_epoch) {}

    /// Starts epoch `epoch` at `at` (where a resumed epoch was backed up, or its beginning).
    void begin(int epoch, const TrainingPosition& at) {
        epoch_ = epoch;
        loss_sum_ = at.loss_sum;
        correct_ = at.correct;
        seen_ = at.seen;
        done_ = at.batches;
        interrupted_ = false;
        ctx_->position = {epoch, done_, loss_sum_, correct_, seen_};
    }
    /// Whether the epoch's step budget is already spent (a resumed epoch whose steps were all
    /// done before the backup).
    bool finished() const { return steps_per_epoch_ > 0 && done_ >= steps_per_epoch_; }

    /// After an update of `examples` examples: sums, position, bar, callbacks. Returns whether
    /// to go on (false: the epoch's steps are done, or a callback set stop_training).
    bool step(double loss_sum, double correct, std::int64_t examples) {
        loss_sum_ += loss_sum;
        correct_ += correct;
        seen_ += examples;
        ++done_;
        ctx_->position = {epoch_, done_, loss_sum_, correct_, seen_};
        logs_->clear();
        logs_->set("loss", mean(loss_sum_));
        if (accuracy_) logs_->set("accuracy", mean(correct_));
        bar_->step(done_, *logs_);
        for (const auto& cb : *callbacks_) cb->on_train_batch_end(*ctx_, done_, *logs_);
        // Keras: stop_training set during a batch (StopOnSignal, a user callback) ends fit after
        // that batch.
        if (ctx_->stop_training) {
            interrupted_ = true;
            return false;
        }
        return !finished();
    }

    /// The epoch's training figures, into logs (cleared first).
    void figures(Logs& logs) const {
        logs.clear();
        logs.set("loss", mean(loss_sum_));
        if (accuracy_) logs.set("accuracy", mean(correct_));
    }
    bool interrupted() const { return interrupted_; }
    std::int64_t done() const { return done_; }
    std::int64_t seen() const { return seen_; }

private:
    double mean(double sum) const { return seen_ ? sum / double(seen_) : 0.0; }

    TrainingContext* ctx_;
    const CallbackList* callbacks_;
    ProgressBar* bar_;
    Logs* logs_;
    bool accuracy_;
    std::int64_t steps_per_epoch_;
    int epoch_ = 0;
    double loss_sum_ = 0, correct_ = 0;
    std::int64_t seen_ = 0, done_ = 0;
    bool interrupted_ = false;
};

/// What the fit loop needs of a model: the parts that depend on its network and strategy.
class FitDriver {
public:
    /// Steps of an epoch when steps_per_epoch is not given (-1 or less: unknown).
    virtual std::int64_t expected_steps() = 0;
    /// Starts an epoch: the metrics counted over it start from zero.
    virtual void begin_epoch() = 0;
    /// Trains epoch `epoch` from its beginning, first skipping (not training on) `skip` batches
    /// of its pass; calls `e.step(...)` after every update until it returns false or the pass
    /// ends.
    virtual void run_epoch(int epoch, std::int64_t skip, FitEpoch& e) = 0;
    /// At an epoch's end, after the training figures: the model's further figures into `logs`
    /// (metrics, validation, learning rate, the strategy's own) and `history` (staleness).
    virtual void end_epoch(std::int64_t seen, Logs& logs, History& history) = 0;
    /// Whether the strategy can resume part-way through an epoch (lockstep strategies can).
    virtual bool resumes_mid_epoch() const = 0;
    /// The epochs the model has trained, once epoch `epoch` is complete.
    virtual void epoch_done(int epoch) = 0;

protected:
    ~FitDriver() = default;
};

/// Settings of one fit (FitOptions without the label type).
struct FitSettings {
    int epochs = 1;
    std::int64_t steps_per_epoch = -1;
    int verbose = 1;
    int initial_epoch = 0;
    bool accuracy = true;
    bool chief = true;  ///< whether this process prints
};

/// Keras's fit loop over `driver`. Returns the History; callbacks see `ctx`.
inline History run_fit(TrainingContext& ctx, FitDriver& driver, const CallbackList& callbacks, const FitSettings& s,
                       double* last_epoch_seconds = nullptr, std::int64_t* last_epoch_examples = nullptr) {
    History history;
    ProgressBar bar(s.chief ? s.verbose : 0);  // one process prints
    ctx.stop_training = false;
    ctx.resume.reset();
    ctx.position = {s.initial_epoch, 0, 0, 0, 0};
    for (const auto& cb : callbacks) cb->on_train_begin(ctx);
    // A callback (BackupAndRestore) restored a backup: start where it was taken.
    const std::optional<TrainingPosition> from = std::exchange(ctx.resume, std::nullopt);
    if (from) {
        STRATA_CHECK(from->epoch >= 0 && from->batches >= 0 && from->seen >= 0, ValueError, "fit: cannot resume at epoch ",
                     from->epoch, ", batch ", from->batches, " (", from->seen, " examples seen)");
        // ParameterServer's updates do not follow the data's order one to one: there is no
        // batch to resume at, only an epoch.
        STRATA_CHECK(driver.resumes_mid_epoch() || from->batches == 0, ValueError, "fit: cannot resume part-way through epoch ",
                     from->epoch, " (after ", from->batches, " updates) under ParameterServer; back up at epoch ends only");
    }
    Logs logs;
    FitEpoch e(ctx, callbacks, bar, logs, s.accuracy, s.steps_per_epoch);
    for (int epoch = from ? from->epoch : s.initial_epoch; epoch < s.epochs && !ctx.stop_training; ++epoch) {
        for (const auto& cb : callbacks) cb->on_epoch_begin(ctx, epoch);
        std::int64_t steps = s.steps_per_epoch > 0 ? s.steps_per_epoch : driver.expected_steps();
        if (steps < 0) steps = 0;  // unknown: the bar shows steps as they come
        bar.epoch_begin(epoch, s.epochs, steps);
        const bool resumed = from && epoch == from->epoch;
        e.begin(epoch, resumed ? *from : TrainingPosition{epoch, 0, 0, 0, 0});
        driver.begin_epoch();
        // A resumed epoch whose steps were all done before the backup trains on nothing.
        if (!e.finished()) driver.run_epoch(epoch, resumed ? from->batches : 0, e);
        if (last_epoch_seconds) *last_epoch_seconds = bar.epoch_seconds();
        if (last_epoch_examples) *last_epoch_examples = e.seen();
        e.figures(logs);
        driver.end_epoch(e.seen(), logs, history);
        bar.epoch_end(e.done(), logs);
        // An epoch stopped part-way is not counted as trained: resuming from a checkpoint
        // (load, then fit with initial_epoch = epoch()) runs it again.
        if (!e.interrupted()) {
            driver.epoch_done(epoch + 1);
            ctx.position = {epoch + 1, 0, 0, 0, 0};
        }
        history.record(epoch, logs);
        for (const auto& cb : callbacks) cb->on_epoch_end(ctx, epoch, logs);
    }
    for (const auto& cb : callbacks) cb->on_train_end(ctx, logs);
    return history;
}

}  // namespace strata::train
