#pragma once
/// \file strata/train/interrupt.hpp
/// `StopOnSignal`: a callback that turns SIGINT (Ctrl-C) and SIGTERM into a clean stop. The
/// signal only sets a flag; after the step in progress the callback sets `stop_training`, and
/// `fit` returns after that step, so the caller can save what it wants and exit (130 by
/// convention for SIGINT). A second signal gets the default action (the process ends at once):
/// a user who presses Ctrl-C twice means it.
///
/// \code
/// auto stop = std::make_shared<strata::train::StopOnSignal>();
/// model.fit(train, {.epochs = 10, .callbacks = {stop}});
/// if (stop->interrupted()) { model.save("interrupted.safetensors"); return 130; }
/// \endcode
///
/// The handlers are installed by the constructor and the previous ones restored by `release()`
/// or the destructor. One StopOnSignal at a time per process (signal dispositions are per
/// process). The signal is also recorded in strata::stop_signal(), which the waits that could
/// outlast it read (a parameter-server worker's injected straggler delay ends at once).
///
/// Signals must be handled until the program's last step, not swallowed after fit: keep the
/// StopOnSignal while the state is being saved (a signal then waits for the save to end), check
/// `interrupted()` afterwards, and `release()` it before work that may simply be cut short (a
/// final evaluation), so that a signal then takes its default action at once:
///
/// \code
/// model.fit(train, {.epochs = 10, .callbacks = {stop}});
/// model.save("final.safetensors");         // a signal here is held until the save is done
/// stop->release();                          // from here on SIGINT/SIGTERM end the process
/// if (stop->interrupted()) return stop->exit_status();
/// model.evaluate(test);
/// \endcode

#include <atomic>
#include <csignal>

#include <signal.h>

#include "strata/core/error.hpp"
#include "strata/core/stop_signal.hpp"
#include "strata/train/callbacks.hpp"

namespace strata::train {

class StopOnSignal : public Callback {
public:
    StopOnSignal() {
        STRATA_CHECK(!active().exchange(true), ValueError, "StopOnSignal: another StopOnSignal is installed in this process");
        caught() = 0;
        struct sigaction sa {};
        sa.sa_handler = &StopOnSignal::handle;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;  // the second signal takes the default action
        ::sigaction(SIGINT, &sa, &old_int_);
        ::sigaction(SIGTERM, &sa, &old_term_);
    }
    ~StopOnSignal() override {
        release();
        // A later run without a StopOnSignal is not stopped by this one's signal (unless another
        // StopOnSignal was installed after release(): the flag is then its).
        if (!active()) caught() = 0;
    }
    /// Restores the previous handlers now (SIGINT and SIGTERM take their default action again,
    /// as they would have without a StopOnSignal); `interrupted()` still says whether a signal
    /// arrived while it was installed. Idempotent.
    void release() {
        if (released_) return;
        ::sigaction(SIGINT, &old_int_, nullptr);
        ::sigaction(SIGTERM, &old_term_, nullptr);
        active() = false;
        released_ = true;
    }
    StopOnSignal(const StopOnSignal&) = delete;
    StopOnSignal& operator=(const StopOnSignal&) = delete;

    /// Whether a signal arrived (training then stopped after the step in progress).
    bool interrupted() const { return caught() != 0; }
    /// The signal that arrived (SIGINT, SIGTERM), 0 if none.
    int signal_number() const { return caught(); }
    /// The exit status a shell expects after that signal: 128 + its number (130 for SIGINT).
    int exit_status() const { return interrupted() ? 128 + caught() : 0; }

    void on_train_batch_end(TrainingContext& ctx, std::int64_t, const Logs&) override {
        if (interrupted()) ctx.stop_training = true;
    }
    void on_epoch_begin(TrainingContext& ctx, int) override {
        if (interrupted()) ctx.stop_training = true;
    }

private:
    static void handle(int sig) { caught() = sig; }
    static std::atomic<int>& caught() { return stop_signal(); }
    static std::atomic<bool>& active() {
        static std::atomic<bool> a{false};
        return a;
    }
    struct sigaction old_int_ {}, old_term_ {};
    bool released_ = false;
};

}  // namespace strata::train
