#pragma once
/// \file strata/train/callbacks.hpp
/// Keras-style callbacks: History, CsvLogger, ModelCheckpoint, TerminateOnNaN, EarlyStopping,
/// LearningRateScheduler, LambdaCallback, and the base class for user-written ones.
///
/// Callbacks run between steps, never inside one: a virtual call per batch costs nothing
/// next to a training step, and keeps user callbacks simple to write.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/train/model_state.hpp"

namespace strata::train {

/// Named figures of a batch or an epoch: "loss", "accuracy", "val_loss", "val_accuracy", "lr".
/// Fixed capacity, no allocation (it is filled every step).
class Logs {
public:
    static constexpr int capacity = 16;
    void set(const char* name, double value) {
        for (int i = 0; i < n_; ++i)
            if (std::strcmp(names_[i], name) == 0) { values_[i] = value; return; }
        STRATA_CHECK(n_ < capacity, ValueError, "Logs: more than ", capacity, " figures");
        names_[n_] = name;
        values_[n_++] = value;
    }
    bool contains(const char* name) const {
        for (int i = 0; i < n_; ++i)
            if (std::strcmp(names_[i], name) == 0) return true;
        return false;
    }
    /// The figure `name`; ValueError naming the available ones when it is missing.
    double get(const char* name) const {
        for (int i = 0; i < n_; ++i)
            if (std::strcmp(names_[i], name) == 0) return values_[i];
        std::string have;
        for (int i = 0; i < n_; ++i) have += std::string(i ? ", " : "") + names_[i];
        throw_error<ValueError>("Logs: no figure named '", name, "' (available: ", have.empty() ? "none" : have, ")");
    }
    int size() const { return n_; }
    const char* name(int i) const { return names_[i]; }
    double value(int i) const { return values_[i]; }
    void clear() { n_ = 0; }

private:
    const char* names_[capacity] = {};
    double values_[capacity] = {};
    int n_ = 0;
};

/// Where `fit` is: the epoch it is in, the batches of that epoch it has trained on, and the
/// running sums the epoch's figures are made of (loss = loss_sum / seen, accuracy = correct /
/// counted: counted is seen, or with a token mask at the output the tokens that count). At the
/// end of a whole epoch e it is {e + 1, 0, 0, 0, 0, 0}. BackupAndRestore saves it and gives it
/// back to fit, so that a resumed epoch reports the figures of an uninterrupted one.
struct TrainingPosition {
    int epoch = 0;
    std::int64_t batches = 0;
    double loss_sum = 0;
    double correct = 0;
    std::int64_t seen = 0;
    double counted = 0;
    friend bool operator==(const TrainingPosition&, const TrainingPosition&) = default;
};

/// What a callback may ask of the model it is attached to.
class TrainingContext {
public:
    virtual ~TrainingContext() = default;
    /// Set to true to stop `fit` after the current epoch (EarlyStopping does).
    bool stop_training = false;
    /// Where fit is; fit updates it before every on_train_batch_end and on_epoch_end.
    TrainingPosition position{};
    /// Set during on_train_begin (BackupAndRestore does) to make fit start at `resume->epoch`,
    /// skip the first `resume->batches` batches of that epoch without training on them, and
    /// start the epoch's sums from the stored ones. fit clears it once taken.
    std::optional<TrainingPosition> resume{};

    virtual double learning_rate() const = 0;
    virtual void set_learning_rate(double lr) = 0;
    /// A host copy of all weights, and its inverse (EarlyStopping's restore_best_weights).
    virtual std::vector<double> weights_snapshot() const = 0;
    virtual void restore_weights(const std::vector<double>& snapshot) = 0;
    /// Whether this process writes files (checkpoints, logs, backups). Every process of a
    /// multi-process job trains; only the chief (rank 0) writes. One process: always.
    virtual bool is_chief() const { return true; }
    /// Whether state(true) needs every process (a Pipeline across processes gathers its
    /// stages): then every process makes the checkpoint calls below, and only the chief writes.
    virtual bool gathers_state() const { return false; }
    /// The model's layout (its parameters and compiled optimizer) and, with `with_values`, its
    /// whole state as it is now: weights, optimizer slots and iterations, learning rate, epochs
    /// done, step counter (strata/train/model_state.hpp).
    virtual ModelState state(bool /*with_values*/) const {
        throw_error<ValueError>("TrainingContext: this context has no model state to save (checkpoints need a strata::Model)");
    }
    /// Takes back a state of this model's layout (read_model_state validated it).
    virtual void restore_state(const ModelState& /*state*/) {
        throw_error<ValueError>("TrainingContext: this context cannot restore a model state (checkpoints need a strata::Model)");
    }

    // The checkpoint operations below are defined in strata/train/checkpoint.hpp (which
    // strata/train/model.hpp includes): the checkpoint code is compiled only where one is called.

    /// Writes a checkpoint (weights, optimizer state, epoch + 1 as the epochs done) atomically to
    /// `path`. These two write on the chief only (the others take part where gathers_state()).
    void save_checkpoint(const std::string& path, int epoch);
    /// Writes the model's whole state as it is now atomically to `path`, with `metadata` added
    /// to the checkpoint's metadata (BackupAndRestore's position).
    void save_state(const std::string& path, const std::map<std::string, std::string>& metadata);
    /// Restores what save_state wrote, strictly: the whole file is validated first, and a
    /// checkpoint of another model or optimizer is a CheckpointError with the model unchanged.
    void load_state(const std::string& path);
};

/// Base of all callbacks: override what you need. Epochs are numbered from 0 here (Keras
/// too); progress lines show them from 1.
class Callback {
public:
    virtual ~Callback() = default;
    virtual void on_train_begin(TrainingContext&) {}
    virtual void on_epoch_begin(TrainingContext&, int /*epoch*/) {}
    virtual void on_train_batch_end(TrainingContext&, std::int64_t /*step*/, const Logs&) {}
    virtual void on_epoch_end(TrainingContext&, int /*epoch*/, const Logs&) {}
    virtual void on_train_end(TrainingContext&, const Logs&) {}
};

using CallbackList = std::vector<std::shared_ptr<Callback>>;

/// What `fit` returns: every epoch's figures, by name (Keras's History.history).
struct History {
    std::vector<int> epoch;
    std::map<std::string, std::vector<double>> history;
    /// ParameterServer only: per epoch, how many applied gradients had each staleness
    /// (staleness[e][s] = gradients of epoch e computed s updates before they were applied).
    std::vector<std::vector<std::int64_t>> staleness;
    const std::vector<double>& operator[](const std::string& name) const {
        const auto it = history.find(name);
        if (it == history.end()) throw_error<ValueError>("History: no figure named '", name, "'");
        return it->second;
    }
    void record(int e, const Logs& logs) {
        epoch.push_back(e);
        for (int i = 0; i < logs.size(); ++i) history[logs.name(i)].push_back(logs.value(i));
    }
};

/// Appends one CSV row per epoch: epoch, then every figure (header from the first epoch).
class CsvLogger : public Callback {
public:
    explicit CsvLogger(std::string path, char separator = ',', bool append = false)
        : path_(std::move(path)), sep_(separator), append_(append) {}
    void on_train_begin(TrainingContext& ctx) override {
        if (!ctx.is_chief()) return;  // only the chief writes; out_ stays closed elsewhere
        out_.open(path_, append_ ? std::ios::app : std::ios::trunc);
        if (!out_) throw_error<IoError>("CsvLogger: cannot open '", path_, "' for writing: ", std::strerror(errno));
        header_written_ = append_ && out_.tellp() > 0;
    }
    void on_epoch_end(TrainingContext&, int epoch, const Logs& logs) override {
        if (!out_.is_open()) return;
        if (!header_written_) {
            out_ << "epoch";
            for (int i = 0; i < logs.size(); ++i) out_ << sep_ << logs.name(i);
            out_ << '\n';
            header_written_ = true;
        }
        out_ << epoch;
        char buf[64];
        for (int i = 0; i < logs.size(); ++i) {
            std::snprintf(buf, sizeof buf, "%.10g", logs.value(i));
            out_ << sep_ << buf;
        }
        out_ << '\n';
        out_.flush();
        if (!out_) throw_error<IoError>("CsvLogger: writing '", path_, "' failed");
    }
    void on_train_end(TrainingContext&, const Logs&) override { out_.close(); }

private:
    std::string path_;
    char sep_;
    bool append_;
    bool header_written_ = false;
    std::ofstream out_;
};

/// Whether a smaller or a larger monitored figure is better ("auto": larger for accuracies).
enum class MonitorMode { Auto, Min, Max };

namespace detail {
inline bool larger_is_better(const std::string& monitor, MonitorMode mode) {
    if (mode == MonitorMode::Min) return false;
    if (mode == MonitorMode::Max) return true;
    return monitor.find("acc") != std::string::npos;
}
}  // namespace detail

/// One replacement field's format spec, Python's mini-language without `#`, `,` and `_`:
/// `[[fill]align][sign][0][width][.precision][type]`, type one of d f F e E g G % (or none).
struct FormatSpec {
    char fill = ' ';
    char align = 0;  ///< '<', '>', '^', '=' or 0 (numbers: right)
    char sign = '-';
    int width = 0;
    int precision = -1;
    char type = 0;
};

namespace detail {
[[noreturn]] inline void bad_spec(const std::string& field, const std::string& spec, const std::string& pattern,
                                  const char* why) {
    throw_error<ValueError>("format: bad format spec '", spec, "' for '", field, "' in '", pattern, "': ", why,
                            " (expected Python's [[fill]align][sign][0][width][.precision][type], type one of "
                            "d, f, F, e, E, g, G, %)");
}

inline FormatSpec parse_spec(const std::string& field, const std::string& spec, const std::string& pattern) {
    FormatSpec f;
    std::size_t i = 0;
    auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
    if (spec.size() >= 2 && is_align(spec[1])) { f.fill = spec[0]; f.align = spec[1]; i = 2; }
    else if (!spec.empty() && is_align(spec[0])) { f.align = spec[0]; i = 1; }
    if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) f.sign = spec[i++];
    if (i < spec.size() && spec[i] == '0') {
        if (f.align == 0) { f.fill = '0'; f.align = '='; }
        ++i;
    }
    auto number = [&](int& out) {
        const std::size_t start = i;
        long v = 0;
        while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9' && v < 1000) v = v * 10 + (spec[i++] - '0');
        if (v >= 1000) bad_spec(field, spec, pattern, "a width or precision of 1000 or more");
        out = int(v);
        return i > start;
    };
    number(f.width);
    if (i < spec.size() && spec[i] == '.') {
        ++i;
        if (!number(f.precision)) bad_spec(field, spec, pattern, "'.' without a precision");
    }
    if (i < spec.size()) {
        const char t = spec[i++];
        if (std::strchr("dfFeEgG%", t) == nullptr) bad_spec(field, spec, pattern, "unknown or unsupported type");
        f.type = t;
    }
    if (i != spec.size()) bad_spec(field, spec, pattern, "characters after the type");
    if (f.type == 'd' && f.precision >= 0) bad_spec(field, spec, pattern, "a precision is not allowed with type 'd'");
    return f;
}

// Python's repr of a float: the shortest text that reads back as the same value, with ".0" on
// integral values ("1.0", "0.25", "1e-05").
inline std::string float_repr(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[64];
    const double a = std::abs(v);
    const bool sci = a != 0 && (a < 1e-4 || a >= 1e16);
    auto r = std::to_chars(buf, buf + sizeof buf, v, sci ? std::chars_format::scientific : std::chars_format::fixed);
    std::string s(buf, r.ptr);
    if (!sci && s.find('.') == std::string::npos) s += ".0";
    if (sci) {  // to_chars writes "1e-05" as Python does; make sure of two exponent digits
        const auto e = s.find('e');
        if (e != std::string::npos && s.size() - e == 3) s.insert(e + 2, "0");
    }
    return s;
}

inline std::string format_value(const std::string& field, const std::string& spec_text, const std::string& pattern,
                                double v, bool integer) {
    const FormatSpec f = parse_spec(field, spec_text, pattern);
    std::string body;
    char buf[1100];
    const double a = std::abs(v);
    const bool neg = std::signbit(v) && !std::isnan(v);
    char t = f.type;
    if (t == 'd' || (t == 0 && integer)) {
        if (v != std::floor(v) || !std::isfinite(v))
            throw_error<ValueError>("format: '", field, "' is ", v, ", not an integer, in '", pattern,
                                    "' (use a float type such as {", field, ":.4f})");
        std::snprintf(buf, sizeof buf, "%.0f", a);
        body = buf;
    } else if (t == 0 && f.precision < 0) {
        body = float_repr(a);
    } else {
        const int prec = f.precision < 0 ? 6 : f.precision;
        if (t == 0) t = 'g';
        const double x = t == '%' ? a * 100 : a;
        const char conv = t == '%' ? 'f' : t;
        const char cfmt[] = {'%', '.', '*', conv, 0};
        std::snprintf(buf, sizeof buf, cfmt, prec, x);
        body = buf;
        if (t == '%') body += '%';
    }
    const std::string sign = neg ? "-" : (f.sign == '+' ? "+" : (f.sign == ' ' ? " " : ""));
    const std::size_t len = sign.size() + body.size();
    const std::size_t pad = std::size_t(f.width) > len ? std::size_t(f.width) - len : 0;
    const char align = f.align ? f.align : '>';
    const std::string fill(pad, f.fill);
    switch (align) {
        case '<': return sign + body + fill;
        case '^': return std::string(pad / 2, f.fill) + sign + body + std::string(pad - pad / 2, f.fill);
        case '=': return sign + fill + body;
        default: return fill + sign + body;
    }
}
}  // namespace detail

/// Fills `pattern` as Python's `str.format(epoch=epoch + 1, **logs)` does, which is how Keras
/// names ModelCheckpoint files: `{epoch}` is the 1-based epoch, `{name}` any figure of `logs`,
/// each with an optional format spec (`{epoch:02d}`, `{val_accuracy:.4f}`, `{loss:e}`,
/// `{lr:g}`); `{{` and `}}` are literal braces. A field without a spec prints the epoch as an
/// integer and a figure as Python prints a float (`0.25`, `1e-05`).
///
/// Requires: every field names `epoch` or a figure in `logs`; specs follow Python's
/// `[[fill]align][sign][0][width][.precision][type]` (type d f F e E g G %; `d` only for
/// integral values). Otherwise: a ValueError naming the field or spec and the figures available.
///
///     format_filepath("w-{epoch:02d}-{val_accuracy:.4f}.safetensors", 2, logs)  // "w-03-0.9812.safetensors"
inline std::string format_filepath(const std::string& pattern, int epoch, const Logs& logs) {
    std::string out;
    std::size_t i = 0;
    while (i < pattern.size()) {
        const char c = pattern[i];
        if (c == '}') {
            if (i + 1 < pattern.size() && pattern[i + 1] == '}') { out += '}'; i += 2; continue; }
            throw_error<ValueError>("format: a single '}' at position ", i, " of '", pattern, "' (write '}}' for a brace)");
        }
        if (c != '{') { out += c; ++i; continue; }
        if (i + 1 < pattern.size() && pattern[i + 1] == '{') { out += '{'; i += 2; continue; }
        const auto close = pattern.find('}', i + 1);
        if (close == std::string::npos)
            throw_error<ValueError>("format: the '{' at position ", i, " of '", pattern, "' is not closed (write '{{' for a brace)");
        const std::string field = pattern.substr(i + 1, close - i - 1);
        const auto colon = field.find(':');
        const std::string key = field.substr(0, colon);
        const std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
        if (key == "epoch") {
            out += detail::format_value(key, spec, pattern, double(epoch + 1), true);
        } else if (!key.empty() && logs.contains(key.c_str())) {
            out += detail::format_value(key, spec, pattern, logs.get(key.c_str()), false);
        } else {
            std::string have = "epoch";
            for (int k = 0; k < logs.size(); ++k) have += std::string(", ") + logs.name(k);
            throw_error<ValueError>("format: '", pattern, "' names '", key, "', which is not a figure of this epoch (available: ",
                                    have, ")");
        }
        i = close + 1;
    }
    return out;
}

/// Saves a checkpoint at the end of every epoch, or only when `monitor` improved
/// (`save_best_only`). `path` is filled by `format_filepath` as Keras fills it:
/// `"w-{epoch:02d}-{val_accuracy:.4f}.safetensors"` gives `w-03-0.9812.safetensors`; `{epoch}`
/// alone is `3`. A field that names no figure is a ValueError at the end of the first epoch.
/// Checkpoints are written atomically: a crash never leaves a half-written file.
class ModelCheckpoint : public Callback {
public:
    struct Options {
        std::string monitor = "val_loss";
        bool save_best_only = false;
        MonitorMode mode = MonitorMode::Auto;
    };
    explicit ModelCheckpoint(std::string path) : ModelCheckpoint(std::move(path), Options{}) {}
    ModelCheckpoint(std::string path, Options options) : path_(std::move(path)), o_(std::move(options)) {
        best_ = detail::larger_is_better(o_.monitor, o_.mode) ? -std::numeric_limits<double>::infinity()
                                                              : std::numeric_limits<double>::infinity();
    }
    void on_epoch_end(TrainingContext& ctx, int epoch, const Logs& logs) override {
        // Filled every epoch, also when nothing is saved, so that a bad path fails at once.
        const std::string path = format_filepath(path_, epoch, logs);
        if (o_.save_best_only) {
            const double v = logs.get(o_.monitor.c_str());
            const bool better = detail::larger_is_better(o_.monitor, o_.mode) ? v > best_ : v < best_;
            if (!better) return;
            best_ = v;
        }
        if (!ctx.is_chief() && !ctx.gathers_state()) return;  // every process tracks the best figure; the chief writes
        ctx.save_checkpoint(path, epoch);
        if (ctx.is_chief()) ++saved_;
    }
    int saved() const { return saved_; }

private:
    std::string path_;
    Options o_;
    double best_;
    int saved_ = 0;
};

/// Keras's TerminateOnNaN, made an error: a loss that is NaN or infinite after a batch, or a
/// weight that is at the end of an epoch, ends fit with a NumericError that says where (epoch,
/// batch; the parameter and the index of its first bad value). Without it a NaN can train on
/// unseen: ReLU and max pooling pass it on, and a NaN weight need not make the loss NaN.
/// The examples use it by default.
class TerminateOnNaN : public Callback {
public:
    void on_train_batch_end(TrainingContext& ctx, std::int64_t batch, const Logs& logs) override {
        if (!logs.contains("loss")) return;
        const double loss = logs.get("loss");
        if (!std::isfinite(loss))
            throw_error<NumericError>("TerminateOnNaN: the loss became ", loss, " at epoch ", ctx.position.epoch + 1, ", batch ",
                                      batch, " (a non-finite input, weight or learning rate; training stopped)");
    }
    void on_epoch_end(TrainingContext& ctx, int epoch, const Logs&) override {
        const auto w = ctx.weights_snapshot();
        std::size_t bad = 0;
        while (bad < w.size() && std::isfinite(w[bad])) ++bad;
        if (bad == w.size()) return;
        std::string where = "weight " + std::to_string(bad);
        for (const auto& p : ctx.state(false).params) {
            std::size_t n = 1;
            for (const auto d : p.dims) n *= d;
            if (bad >= std::size_t(p.offset) && bad < std::size_t(p.offset) + n) {
                where = "parameter '" + p.name + "', index " + std::to_string(bad - std::size_t(p.offset));
                break;
            }
        }
        throw_error<NumericError>("TerminateOnNaN: ", where, " is ", w[bad], " after epoch ", epoch + 1,
                                  " (training stopped)");
    }
};

/// Stops training when `monitor` has not improved by more than `min_delta` for `patience`
/// epochs; optionally restores the best epoch's weights.
class EarlyStopping : public Callback {
public:
    struct Options {
        std::string monitor = "val_loss";
        double min_delta = 0.0;
        int patience = 0;
        MonitorMode mode = MonitorMode::Auto;
        bool restore_best_weights = false;
    };
    EarlyStopping() : EarlyStopping(Options{}) {}
    explicit EarlyStopping(Options options) : o_(std::move(options)) {}
    void on_train_begin(TrainingContext&) override {
        wait_ = 0;
        stopped_epoch_ = -1;
        best_epoch_ = -1;
        best_ = larger() ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    }
    void on_epoch_end(TrainingContext& ctx, int epoch, const Logs& logs) override {
        const double v = logs.get(o_.monitor.c_str());
        const bool better = larger() ? v - o_.min_delta > best_ : v + o_.min_delta < best_;
        if (better) {
            best_ = v;
            best_epoch_ = epoch;
            wait_ = 0;
            if (o_.restore_best_weights) best_weights_ = ctx.weights_snapshot();
            return;
        }
        if (++wait_ >= o_.patience) {
            stopped_epoch_ = epoch;
            ctx.stop_training = true;
            if (o_.restore_best_weights && !best_weights_.empty()) ctx.restore_weights(best_weights_);
        }
    }
    /// The epoch training stopped at (-1 if it ran to the end) and the best epoch.
    int stopped_epoch() const { return stopped_epoch_; }
    int best_epoch() const { return best_epoch_; }

private:
    bool larger() const { return detail::larger_is_better(o_.monitor, o_.mode); }
    Options o_;
    int wait_ = 0, stopped_epoch_ = -1, best_epoch_ = -1;
    double best_ = 0;
    std::vector<double> best_weights_;
};

/// Sets the learning rate at the start of each epoch to `schedule(epoch, current_lr)`.
class LearningRateScheduler : public Callback {
public:
    explicit LearningRateScheduler(std::function<double(int, double)> schedule) : schedule_(std::move(schedule)) {}
    void on_epoch_begin(TrainingContext& ctx, int epoch) override {
        const double lr = schedule_(epoch, ctx.learning_rate());
        STRATA_CHECK(std::isfinite(lr) && lr >= 0, ValueError, "LearningRateScheduler: the schedule returned ", lr,
                     " for epoch ", epoch, "; a learning rate must be finite and >= 0");
        ctx.set_learning_rate(lr);
    }

private:
    std::function<double(int, double)> schedule_;
};

/// A callback made of functions (any may be empty), for small user hooks.
class LambdaCallback : public Callback {
public:
    std::function<void(TrainingContext&, int)> epoch_begin;
    std::function<void(TrainingContext&, int, const Logs&)> epoch_end;
    std::function<void(TrainingContext&, std::int64_t, const Logs&)> batch_end;
    void on_epoch_begin(TrainingContext& c, int e) override { if (epoch_begin) epoch_begin(c, e); }
    void on_epoch_end(TrainingContext& c, int e, const Logs& l) override { if (epoch_end) epoch_end(c, e, l); }
    void on_train_batch_end(TrainingContext& c, std::int64_t s, const Logs& l) override { if (batch_end) batch_end(c, s, l); }
};

}  // namespace strata::train
