#pragma once
/// \file strata/train/impl/checkpoint.ipp
/// The definitions behind strata/train/checkpoint.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>
#include <system_error>
#include <type_traits>

#include "strata/io/safetensors.hpp"
#include "strata/io/text.hpp"
#include "strata/train/checkpoint.hpp"

namespace strata::train {

namespace detail::ckpt {

// "a, b, c and 4 more": a hostile file can hold a million names; a message lists a few.
inline std::string some_names(const std::vector<std::string>& names, std::size_t shown = 5) {
    std::string s;
    for (std::size_t i = 0; i < names.size() && i < shown; ++i) {
        if (i) s += ", ";
        s += io::in_quotes(names[i], 200);
    }
    if (names.size() > shown) s += " and " + std::to_string(names.size() - shown) + " more";
    return s;
}

template <class I>
[[noreturn]] void bad_integer(std::string_view where, std::string_view key, std::string_view text, I min, I max) {
    throw_error<CheckpointError>(where, "metadata ", io::in_quotes(key, 200), ": expected a decimal integer in [", +min, ", ", +max,
                                 "] (digits only: no sign", std::cmp_less(min, 0) ? " but '-'" : "",
                                 ", no spaces, no exponent), found ", io::in_quotes(text, 200));
}

// Strict decimal: std::from_chars takes no whitespace and no '+'; it would take '-' for a
// signed type, so a minus is refused first where negatives are out of range.
template <std::integral I>
I parse_int(std::string_view where, std::string_view key, std::string_view text, I min, I max) {
    if (text.empty() || (text[0] == '-' && !std::cmp_less(min, 0))) bad_integer(where, key, text, min, max);
    I v{};
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 10);
    if (ec != std::errc{} || end != text.data() + text.size() || v < min || v > max) bad_integer(where, key, text, min, max);
    return v;
}

inline double parse_rate(std::string_view where, std::string_view text, const char* key = "learning_rate",
                         const char* like = "0.001") {
    double v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::general);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(v) || v < 0)
        throw_error<CheckpointError>(where, "metadata '", key, "': expected a finite number >= 0 (like ", like, "), found ",
                                     io::in_quotes(text, 200));
    return v;
}

// Copies an F32 or F64 tensor (checked by the caller) into dst, converting to T.
template <class T>
void read_values(const io::SafetensorsFile& f, const io::TensorInfo& t, T* dst) {
    const auto bytes = f.bytes(t.name);
    const std::size_t n = t.numel();
    auto convert = [&]<class U>(U*) {
        if constexpr (std::same_as<U, T>) {
            io::detail::st::copy_le(dst, bytes.data(), n, sizeof(T));
        } else {
            std::vector<U> tmp(n);
            io::detail::st::copy_le(tmp.data(), bytes.data(), n, sizeof(U));
            for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<T>(tmp[i]);
        }
    };
    if (t.dtype == io::Dtype::F32) convert(static_cast<float*>(nullptr));
    else convert(static_cast<double*>(nullptr));
}

inline void check_spec(const CheckpointSpec& spec) {
    std::int64_t total = 0;
    std::set<std::string_view> names;
    for (const auto& p : spec.params) {
        const auto n = io::detail::st::checked_numel(p.dims);
        STRATA_CHECK(n && p.offset >= 0 && p.offset <= spec.num_params &&
                         *n <= static_cast<std::uint64_t>(spec.num_params - p.offset),
                     ValueError, "read_checkpoint: parameter ", io::in_quotes(p.name, 200), " of shape ", io::shape_text(p.dims),
                     " at offset ", p.offset, " does not fit the flat buffer of ", spec.num_params, " values");
        STRATA_CHECK(names.insert(p.name).second, ValueError, "read_checkpoint: parameter ", io::in_quotes(p.name, 200),
                     " is listed twice in the spec");
        total += static_cast<std::int64_t>(*n);
    }
    STRATA_CHECK(total == spec.num_params, ValueError, "read_checkpoint: the spec's parameters hold ", total,
                 " values, but num_params is ", spec.num_params);
}

}  // namespace detail::ckpt

STRATA_DECL std::int64_t parse_metadata_int(std::string_view key, std::string_view text, std::int64_t min, std::int64_t max) {
    return detail::ckpt::parse_int<std::int64_t>("", key, text, min, max);
}

/// parse_metadata_int for unsigned 64-bit values (seeds, step counts), range [0, max].
STRATA_DECL std::uint64_t parse_metadata_uint(std::string_view key, std::string_view text,
                                         std::uint64_t max) {
    return detail::ckpt::parse_int<std::uint64_t>("", key, text, 0, max);
}

namespace detail::ckpt {

// A metadata value of the file, or null.
inline const std::string* metadata(const io::SafetensorsFile& f, std::string_view key) {
    const auto& m = f.metadata();
    const auto it = m.find(key);
    return it == m.end() ? nullptr : &it->second;
}

// Format first: a file of another kind or version should say so, not list missing tensors.
inline void check_format(const io::SafetensorsFile& f, const std::string& where, const CheckpointSpec& spec) {
    const std::string* format = metadata(f, "format");
    if (!format || *format != "strata-checkpoint")
        throw_error<CheckpointError>(where, "not a strata checkpoint: expected metadata format = 'strata-checkpoint', found ",
                                     format ? io::in_quotes(*format, 200) : std::string("none"));
    const std::string* version = metadata(f, "format_version");
    if (!version)
        throw_error<CheckpointError>(where, "expected metadata format_version = ", spec.format_version, ", found none");
    const auto v = parse_int<std::int64_t>(where, "format_version", *version, 0, std::numeric_limits<int>::max());
    if (v != spec.format_version)
        throw_error<CheckpointError>(where, "checkpoint format version ", v, "; this strata reads version ", spec.format_version);
}

// The tensors the model reads, checked before any value is copied: each present, F32 or F64, of
// the expected shape; the missing ones named together; the names used (read or deliberately
// ignored), so that a strict read can refuse the others.
struct TensorPlan {
    const io::SafetensorsFile& f;
    const std::string& where;
    std::set<std::string_view> used{};
    std::vector<std::string> missing{};

    const io::TensorInfo* expect(const std::string& name, const std::vector<std::size_t>& dims) {
        if (!f.contains(name)) {
            missing.push_back(name);
            return nullptr;
        }
        const io::TensorInfo& t = f.info(name);
        used.insert(t.name);
        if (t.dtype != io::Dtype::F32 && t.dtype != io::Dtype::F64)
            throw_error<CheckpointError>(where, "tensor ", io::in_quotes(name, 200), ": expected dtype F32 or F64, found ", io::dtype_name(t.dtype));
        if (t.shape != dims)
            throw_error<CheckpointError>(where, "tensor ", io::in_quotes(name, 200), ": the model expects shape ", io::shape_text(dims),
                                         ", the checkpoint holds ", io::shape_text(t.shape));
        return &t;
    }
    void refuse_missing(const char* what) const {
        if (missing.empty()) return;
        throw_error<CheckpointError>(where, missing.size() == 1 ? "missing " : std::to_string(missing.size()) + " missing ",
                                     what, missing.size() == 1 ? " tensor " : " tensors ", some_names(missing));
    }
};

inline const std::string optimizer_prefix = "optimizer/";

// The optimizer's state is read only when it is the same optimizer with the same slots;
// anything else is refused when strict and left out (the optimizer starts afresh) when not.
// Returns whether the slots are read, their tensors (slot by slot, variable by variable) in
// `slot_tensors`.
inline bool plan_slots(TensorPlan& plan, const CheckpointSpec& spec, std::vector<std::vector<const io::TensorInfo*>>& slot_tensors) {
    if (spec.optimizer.empty()) return false;
    const std::string* saved = metadata(plan.f, "optimizer");
    if (!saved) {
        if (spec.strict)
            throw_error<CheckpointError>(plan.where, "the checkpoint holds no optimizer state (it was saved before compile); "
                                         "the model is compiled with ", spec.optimizer,
                                         " (load with strict = false to take the weights alone)");
        return false;
    }
    if (*saved != spec.optimizer) {
        if (spec.strict)
            throw_error<CheckpointError>(plan.where, "the checkpoint holds ", io::clipped(*saved), " state; the model is compiled with ",
                                         spec.optimizer, " (load with strict = false to take the weights alone)");
        return false;
    }
    bool read_slots = true;
    for (const auto& slot : spec.slots) {
        slot_tensors.emplace_back();
        for (const auto& p : spec.params) slot_tensors.back().push_back(plan.expect(optimizer_prefix + slot + "/" + p.name, p.dims));
    }
    if (!plan.missing.empty() && !spec.strict) {
        // Another configuration of the same optimizer (SGD with momentum saved, without loaded).
        read_slots = false;
        plan.missing.clear();
    }
    plan.refuse_missing("optimizer slot");
    return read_slots;
}

// Strict: a tensor the model does not have is refused. Optimizer tensors the model does not read
// (not compiled, or another optimizer when not strict) are deliberately ignored, not unknown:
// evaluating a trained model must work.
inline void refuse_unknown(TensorPlan& plan, const CheckpointSpec& spec, bool read_slots) {
    if (!read_slots)
        for (const auto& t : plan.f.tensors())
            if (std::string_view(t.name).starts_with(optimizer_prefix)) plan.used.insert(t.name);
    if (!spec.strict) return;
    std::vector<std::string> unknown;
    for (const auto& t : plan.f.tensors())
        if (!plan.used.contains(t.name)) unknown.push_back(t.name);
    if (!unknown.empty())
        throw_error<CheckpointError>(plan.where, "the checkpoint holds ", unknown.size(), unknown.size() == 1 ? " tensor" : " tensors",
                                     " the model does not have: ", some_names(unknown),
                                     " (a checkpoint of another model? load with strict = false to ignore them)");
}

// The counters and rates of the metadata; the optimizer's (its iterations, a dynamic loss scale)
// only with its slots.
template <class T>
void read_metadata(CheckpointData<T>& data, const io::SafetensorsFile& f, const std::string& where, bool read_slots) {
    constexpr auto int_max = std::numeric_limits<int>::max();
    constexpr auto u64_max = std::numeric_limits<std::uint64_t>::max();
    constexpr auto i64_max = std::numeric_limits<std::int64_t>::max();
    if (const auto* s = metadata(f, "epoch")) data.epoch = static_cast<int>(parse_int<std::int64_t>(where, "epoch", *s, 0, int_max));
    if (const auto* s = metadata(f, "step")) data.step = parse_int<std::uint64_t>(where, "step", *s, 0, u64_max);
    if (const auto* s = metadata(f, "seed")) data.seed = parse_int<std::uint64_t>(where, "seed", *s, 0, u64_max);
    if (const auto* s = metadata(f, "learning_rate")) data.learning_rate = parse_rate(where, *s);
    if (!read_slots) return;
    if (const auto* s = metadata(f, "optimizer_iterations"))
        data.optimizer_iterations = parse_int<std::int64_t>(where, "optimizer_iterations", *s, 0, i64_max);
    // A dynamic loss scale (precision::MixedFloat16): where it stood, so a resumed run goes on
    // with the same scale.
    if (const auto* s = metadata(f, "loss_scale")) {
        const double scale = parse_rate(where, *s, "loss_scale", "32768");
        if (scale <= 0)
            throw_error<CheckpointError>(where, "metadata 'loss_scale': expected a finite number > 0, found ", io::in_quotes(*s, 200));
        data.loss_scale = scale;
        if (const auto* g = metadata(f, "loss_scale_good_steps"))
            data.loss_scale_good_steps = parse_int<std::int64_t>(where, "loss_scale_good_steps", *g, 0, i64_max);
        if (const auto* k = metadata(f, "loss_scale_skipped_steps"))
            data.loss_scale_skipped_steps = parse_int<std::int64_t>(where, "loss_scale_skipped_steps", *k, 0, i64_max);
    }
}

// Tensor `t` (named `name`) into `dst`; each value must be finite (a NaN weight would train on
// silently: ReLU and pooling pass it on, the loss may not show it).
template <class T>
void read_finite(const io::SafetensorsFile& f, const io::TensorInfo& t, T* dst, const std::string& name, const std::string& where) {
    read_values(f, t, dst);
    const std::size_t n = t.numel();
    for (std::size_t k = 0; k < n; ++k)
        if (!std::isfinite(dst[k]))
            throw_error<CheckpointError>(where, "tensor ", io::in_quotes(name, 200), " holds ", dst[k], " at index ", k,
                                         " (row-major, of ", n, " values): a checkpoint's values must be finite");
}

}  // namespace detail::ckpt

template <std::floating_point T>
CheckpointData<T> read_checkpoint(const std::filesystem::path& path, const CheckpointSpec& spec) {
    using namespace detail::ckpt;
    check_spec(spec);
    const auto f = io::SafetensorsFile::load(path);
    const std::string where = "checkpoint " + io::in_quotes(path.string(), 200) + ": ";
    check_format(f, where, spec);
    TensorPlan plan{f, where};
    std::vector<const io::TensorInfo*> params;
    params.reserve(spec.params.size());
    for (const auto& p : spec.params) params.push_back(plan.expect(p.name, p.dims));
    plan.refuse_missing("parameter");
    std::vector<std::vector<const io::TensorInfo*>> slot_tensors;
    const bool read_slots = plan_slots(plan, spec, slot_tensors);
    refuse_unknown(plan, spec, read_slots);

    CheckpointData<T> data;
    read_metadata(data, f, where, read_slots);
    // Everything is validated: only now are the values copied.
    data.params.resize(static_cast<std::size_t>(spec.num_params));
    for (std::size_t i = 0; i < spec.params.size(); ++i)
        read_finite(f, *params[i], data.params.data() + spec.params[i].offset, spec.params[i].name, where);
    if (read_slots) {
        for (std::size_t s = 0; s < spec.slots.size(); ++s) {
            std::vector<T> values(static_cast<std::size_t>(spec.num_params));
            for (std::size_t i = 0; i < spec.params.size(); ++i)
                read_finite(f, *slot_tensors[s][i], values.data() + spec.params[i].offset,
                            optimizer_prefix + spec.slots[s] + "/" + spec.params[i].name, where);
            data.slots.emplace_back(spec.slots[s], std::move(values));
        }
    }
    return data;
}

STRATA_DECL void write_checkpoint(const std::filesystem::path& path, const ModelState& state,
                             const std::map<std::string, std::string>& extra) {
    STRATA_CHECK(state.has_values && std::int64_t(state.weights.size()) == state.num_params, ValueError,
                 "write_checkpoint: the state holds ", state.weights.size(), " weights, the layout ", state.num_params);
    io::SafetensorsWriter w;
    for (const auto& [key, value] : extra) w.set_metadata(key, value);
    std::vector<float> narrow;  // F32 models: every value converts back exactly
    auto add = [&](std::string name, const CheckpointTensor& p, const std::vector<double>& flat) {
        const auto* first = flat.data() + p.offset;
        std::size_t n = 1;
        for (const auto d : p.dims) n *= d;
        if (state.f64) {
            w.add<double>(std::move(name), p.dims, std::span<const double>(first, n));
        } else {
            narrow.assign(first, first + n);
            w.add<float>(std::move(name), p.dims, std::span<const float>(narrow));
        }
    };
    for (const auto& p : state.params) add(p.name, p, state.weights);
    if (!state.optimizer.empty()) {
        STRATA_CHECK(state.slots.size() == state.slot_names.size(), ValueError, "write_checkpoint: ", state.slot_names.size(),
                     " optimizer slots named, ", state.slots.size(), " given");
        for (std::size_t s = 0; s < state.slots.size(); ++s)
            for (const auto& p : state.params) add("optimizer/" + state.slot_names[s] + "/" + p.name, p, state.slots[s]);
        w.set_metadata("optimizer", state.optimizer);
        if (state.optimizer_iterations) w.set_metadata("optimizer_iterations", std::to_string(*state.optimizer_iterations));
        if (state.loss_scale) {
            char v[40];
            std::snprintf(v, sizeof v, "%.17g", *state.loss_scale);
            w.set_metadata("loss_scale", v);
            w.set_metadata("loss_scale_good_steps", std::to_string(state.loss_scale_good_steps));
            w.set_metadata("loss_scale_skipped_steps", std::to_string(state.loss_scale_skipped_steps));
        }
        if (state.learning_rate) {
            char lr[40];
            std::snprintf(lr, sizeof lr, "%.17g", *state.learning_rate);
            w.set_metadata("learning_rate", lr);
        }
    }
    w.set_metadata("format", "strata-checkpoint");
    w.set_metadata("format_version", std::to_string(checkpoint_format_version));
    w.set_metadata("epoch", std::to_string(state.epoch));
    w.set_metadata("step", std::to_string(state.step));
    if (state.seed) w.set_metadata("seed", std::to_string(*state.seed));
    w.save(path);
}

STRATA_DECL ModelState read_model_state(const std::filesystem::path& path, const ModelState& layout, bool strict) {
    CheckpointSpec spec;
    spec.params = layout.params;
    spec.num_params = layout.num_params;
    spec.optimizer = layout.optimizer;
    spec.slots = layout.slot_names;
    spec.strict = strict;
    spec.format_version = checkpoint_format_version;
    auto data = read_checkpoint<double>(path, spec);
    ModelState s;
    s.params = layout.params;
    s.num_params = layout.num_params;
    s.f64 = layout.f64;
    s.optimizer = layout.optimizer;
    s.slot_names = layout.slot_names;
    s.has_values = true;
    s.weights = std::move(data.params);
    for (auto& [name, values] : data.slots) s.slots.push_back(std::move(values));
    s.optimizer_iterations = data.optimizer_iterations;
    s.loss_scale = data.loss_scale;
    s.loss_scale_good_steps = data.loss_scale_good_steps;
    s.loss_scale_skipped_steps = data.loss_scale_skipped_steps;
    s.learning_rate = data.learning_rate;
    s.epoch = data.epoch;
    s.step = data.step;
    s.seed = data.seed;
    return s;
}

// TrainingContext's checkpoint members (declared in callbacks.hpp): defined here, so that the
// checkpoint code is compiled only where a callback or a program saves or loads.

STRATA_DECL void TrainingContext::save_checkpoint(const std::string& path, int epoch) {
    ModelState s = state(true);
    s.epoch = epoch + 1;
    if (is_chief()) write_checkpoint(path, s);
}

STRATA_DECL void TrainingContext::save_state(const std::string& path, const std::map<std::string, std::string>& metadata) {
    const ModelState s = state(true);  // every process takes part where the model gathers its state
    if (is_chief()) write_checkpoint(path, s, metadata);
}

STRATA_DECL void TrainingContext::load_state(const std::string& path) { restore_state(read_model_state(path, state(false), true)); }

}  // namespace strata::train
