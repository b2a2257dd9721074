#pragma once
/// \file strata/train/impl/fit_loop.ipp
/// The definitions behind strata/train/fit_loop.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <optional>
#include <utility>

#include "strata/train/fit_loop.hpp"

namespace strata::train {

STRATA_DECL void FitEpoch::begin(int epoch, const TrainingPosition& at) {
    epoch_ = epoch;
    loss_sum_ = at.loss_sum;
    correct_ = at.correct;
    seen_ = at.seen;
    counted_ = at.counted;
    done_ = at.batches;
    interrupted_ = false;
    ctx_->position = {epoch, done_, loss_sum_, correct_, seen_, counted_};
}

STRATA_DECL bool FitEpoch::step(double loss_sum, double correct, std::int64_t examples, double counted) {
    loss_sum_ += loss_sum;
    correct_ += correct;
    seen_ += examples;
    counted_ += counted;
    ++done_;
    ctx_->position = {epoch_, done_, loss_sum_, correct_, seen_, counted_};
    logs_->clear();
    logs_->set("loss", mean(loss_sum_));
    if (accuracy_) logs_->set("accuracy", accuracy());
    bar_->step(done_, *logs_);
    for (const auto& cb : *callbacks_) cb->on_train_batch_end(*ctx_, done_, *logs_);
    // Across processes every rank stops after the same step: a rank that stopped alone (a
    // signal that reached one pipeline stage) left the others waiting for its next message.
    ctx_->stop_training = driver_->agree_stop({ctx_->stop_training, stop_signal().load()}, true).stop;
    // Keras: stop_training set during a batch (StopOnSignal, a user callback) ends fit after
    // that batch.
    if (ctx_->stop_training) {
        interrupted_ = true;
        return false;
    }
    return !finished();
}

STRATA_DECL void FitEpoch::figures(Logs& logs) const {
    logs.clear();
    logs.set("loss", mean(loss_sum_));
    if (accuracy_) logs.set("accuracy", accuracy());
}

STRATA_DECL History run_fit(TrainingContext& ctx, FitDriver& driver, const CallbackList& callbacks, const FitSettings& s,
                       double* last_epoch_seconds, std::int64_t* last_epoch_examples) {
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
        // A backup taken after more steps of its epoch than this run's epochs have (another
        // steps_per_epoch, BackupAndRestore's allow_config_change) has no batch to resume at: once
        // that epoch was silently counted done ("30/20"), and the run went on from a position no
        // uninterrupted run of either configuration passes through.
        STRATA_CHECK(s.steps_per_epoch <= 0 || from->batches <= s.steps_per_epoch, ValueError, "fit: cannot resume epoch ",
                     from->epoch, " after batch ", from->batches, ": expected at most steps_per_epoch = ", s.steps_per_epoch,
                     " batches done in an epoch, found ", from->batches, " in the backup (it was made with more steps per epoch)");
    }
    Logs logs;
    FitEpoch e(ctx, driver, callbacks, bar, logs, s.accuracy, s.steps_per_epoch);
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
        // Every rank is here (a parameter server's servers and workers too, which do not step):
        // a stop asked for where no step agreement reaches it is agreed now.
        const distribute::StopRequest agreed = driver.agree_stop({ctx.stop_training, stop_signal().load()}, false);
        ctx.stop_training = agreed.stop;
        if (last_epoch_seconds) *last_epoch_seconds = bar.epoch_seconds();
        if (last_epoch_examples) *last_epoch_examples = e.seen();
        e.figures(logs);
        // Stopped by a signal: the validation pass is skipped (on every rank: the signal is
        // agreed), since under mpirun SIGKILL follows SIGTERM within a second
        // (odls_base_sigkill_timeout) and the state must be saved before it.
        driver.end_epoch(e.seen(), logs, history, agreed.signal == 0);
        // A signal during the validation pass (which it cut short) stops fit here, on every
        // rank, rather than after the next epoch's first step.
        const distribute::StopRequest after = driver.agree_stop({ctx.stop_training, stop_signal().load()}, false);
        ctx.stop_training = after.stop || after.signal != 0;
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
    // A signal that reached one rank during the last epoch's validation: every rank must take
    // the same branch after fit (the save, or the evaluation that follows, are collective).
    if (driver.agree_stop({ctx.stop_training, stop_signal().load()}, false).stop) ctx.stop_training = true;
    for (const auto& cb : callbacks) cb->on_train_end(ctx, logs);
    return history;
}

}  // namespace strata::train
