#pragma once
/// \file strata/train/fit_loop.hpp
/// The part of `Model::fit` that does not depend on the network, the strategy, the element
/// type or the label type: epochs, callbacks, the progress bar, logs, history, and resuming
/// from a backup. It is written once, without templates, and drives the model through a
/// small interface (`FitDriver`) that `Model` implements for its Net × Strategy. So a program
/// that trains several models compiles this loop once, not once per model (and, with the
/// compiled part, not at all: impl/fit_loop.ipp is then in the library).

#include <cstdint>
#include <optional>
#include <utility>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/distribute/stop_agreement.hpp"
#include "strata/train/callbacks.hpp"
#include "strata/train/progress.hpp"

namespace strata::train {

class FitDriver;

/// What fit does with one epoch's updates: the running figures, the progress bar and the
/// callbacks after every step. Model's epoch runner calls step() after each update.
class FitEpoch {
public:
    FitEpoch(TrainingContext& ctx, FitDriver& driver, const CallbackList& callbacks, ProgressBar& bar, Logs& logs, bool accuracy,
             std::int64_t steps_per_epoch)
        : ctx_(&ctx), driver_(&driver), callbacks_(&callbacks), bar_(&bar), logs_(&logs), accuracy_(accuracy),
          steps_per_epoch_(steps_per_epoch) {}

    /// Starts epoch `epoch` at `at` (where a resumed epoch was backed up, or its beginning).
    void begin(int epoch, const TrainingPosition& at);
    /// Whether the epoch's step budget is already spent (a resumed epoch whose steps were all
    /// done before the backup).
    bool finished() const { return steps_per_epoch_ > 0 && done_ >= steps_per_epoch_; }

    /// After an update of `examples` examples: sums, position, bar, callbacks, then the stop
    /// agreed by every rank (FitDriver::agree_stop). Returns whether to go on (false: the
    /// epoch's steps are done, or a callback on any rank set stop_training).
    /// `counted`: what `correct` is out of (the examples, or the tokens that count).
    bool step(double loss_sum, double correct, std::int64_t examples, double counted);

    /// The epoch's training figures, into logs (cleared first).
    void figures(Logs& logs) const;
    bool interrupted() const { return interrupted_; }
    std::int64_t done() const { return done_; }
    std::int64_t seen() const { return seen_; }

private:
    double mean(double sum) const { return seen_ ? sum / double(seen_) : 0.0; }
    double accuracy() const { return counted_ > 0 ? correct_ / counted_ : 0.0; }

    TrainingContext* ctx_;
    FitDriver* driver_;
    const CallbackList* callbacks_;
    ProgressBar* bar_;
    Logs* logs_;
    bool accuracy_;
    std::int64_t steps_per_epoch_;
    int epoch_ = 0;
    double loss_sum_ = 0, correct_ = 0, counted_ = 0;
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
    /// (metrics, validation unless `validate` is false, learning rate, the strategy's own) and
    /// `history` (staleness).
    virtual void end_epoch(std::int64_t seen, Logs& logs, History& history, bool validate) = 0;
    /// Whether the strategy can resume part-way through an epoch (lockstep strategies can).
    virtual bool resumes_mid_epoch() const = 0;
    /// The epochs the model has trained, once epoch `epoch` is complete.
    virtual void epoch_done(int epoch) = 0;
    /// Across processes: `mine` combined with every rank's (distribute::agree_stop: any rank's
    /// stop, the highest signal, written into strata::stop_signal()), the same on every rank.
    /// fit calls it after each step (`at_step`), after each epoch's training and validation,
    /// and before it returns. One process, and the parameter server (whose ranks never all
    /// meet: its workers do not step, and a lost one is trained on without): `mine`.
    virtual distribute::StopRequest agree_stop(distribute::StopRequest mine, bool at_step) {
        (void)at_step;
        return mine;
    }

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
STRATA_DECL History run_fit(TrainingContext& ctx, FitDriver& driver, const CallbackList& callbacks, const FitSettings& s,
                            double* last_epoch_seconds = nullptr, std::int64_t* last_epoch_examples = nullptr);

}  // namespace strata::train

#if STRATA_DEFINITIONS
#include "strata/train/impl/fit_loop.ipp"
#endif
