#pragma once
/// \file strata/train/progress.hpp
/// Keras-like progress output:
///
///     Epoch 3/10
///     469/469 [==============================] - 12s 25ms/step - loss: 0.0421 - accuracy: 0.9871
///
/// On a terminal the bar is redrawn in place (at most ten times a second); when the output is
/// not a terminal (a log file, CI) only the finished line of each epoch is printed.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include <unistd.h>

#include "strata/train/callbacks.hpp"

namespace strata::train {

class ProgressBar {
public:
    /// verbose: 0 silent, 1 bar, 2 one line per epoch. `out` is where it writes (stdout).
    explicit ProgressBar(int verbose = 1, std::FILE* out = stdout) : verbose_(verbose), out_(out) {
        tty_ = out == stdout ? ::isatty(STDOUT_FILENO) : (out == stderr ? ::isatty(STDERR_FILENO) : false);
    }
    void epoch_begin(int epoch, int epochs, std::int64_t steps) {
        steps_ = steps;
        start_ = last_draw_ = Clock::now();
        if (verbose_ == 0) return;
        std::fprintf(out_, "Epoch %d/%d\n", epoch + 1, epochs);
        std::fflush(out_);
    }
    void step(std::int64_t done, const Logs& logs) {
        if (verbose_ != 1 || !tty_) return;
        const auto now = Clock::now();
        if (done != steps_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
        last_draw_ = now;
        draw(done, logs, false);
    }
    void epoch_end(std::int64_t done, const Logs& logs) {
        if (verbose_ == 0) return;
        draw(done, logs, true);
    }
    double epoch_seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

private:
    using Clock = std::chrono::steady_clock;
    void draw(std::int64_t done, const Logs& logs, bool final_line) {
        char line[512];
        int n = 0;
        const double secs = epoch_seconds();
        const std::int64_t total = steps_ > 0 ? steps_ : done;
        if (verbose_ == 1) {
            const int width = 30;
            const int filled = total > 0 ? int(double(width) * double(done) / double(total)) : width;
            std::string bar(std::size_t(width), '.');
            for (int i = 0; i < filled && i < width; ++i) bar[std::size_t(i)] = '=';
            if (filled < width && done < total) bar[std::size_t(filled)] = '>';
            n += std::snprintf(line + n, sizeof line - std::size_t(n), "%lld/%lld [%s]", (long long)done, (long long)total, bar.c_str());
        } else {
            n += std::snprintf(line + n, sizeof line - std::size_t(n), "%lld/%lld", (long long)done, (long long)total);
        }
        const double per_step = done > 0 ? secs / double(done) : 0.0;
        if (done < total && verbose_ == 1) {
            n += std::snprintf(line + n, sizeof line - std::size_t(n), " - ETA: %.0fs", per_step * double(total - done));
        } else {
            n += std::snprintf(line + n, sizeof line - std::size_t(n), " - %.0fs %.0fms/step", secs, per_step * 1e3);
        }
        for (int i = 0; i < logs.size() && n < int(sizeof line) - 40; ++i)
            n += std::snprintf(line + n, sizeof line - std::size_t(n), " - %s: %.4f", logs.name(i), logs.value(i));
        if (tty_ && verbose_ == 1) std::fprintf(out_, "\r%s\033[K", line);
        else std::fprintf(out_, "%s", line);
        if (final_line) std::fputc('\n', out_);
        std::fflush(out_);
    }

    int verbose_;
    std::FILE* out_;
    bool tty_ = false;
    std::int64_t steps_ = 0;
    Clock::time_point start_, last_draw_;
};

}  // namespace strata::train
