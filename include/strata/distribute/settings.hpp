#pragma once
/// \file strata/distribute/settings.hpp
/// What the processes of a job compare before they train together, as (name, value) text:
/// the Settings type, the program's settings every process group compares when it joins
/// (set_job_settings) and a model's signature (an optimizer reads as optim::describe). The
/// comparison itself (point to point, with a deadline, the same ValueError on every rank) is
/// collective::ProcessGroup's (join and agree(), strata/distribute/collective/process_group.hpp);
/// MultiWorkerMirrored and ParameterServer across processes both use it. No MPI here.
///
/// \code
/// strata::distribute::collective::Settings s = strata::distribute::detail::model_settings<Net, float>();
/// s.push_back({"optimizer", strata::optim::describe(strata::optim::SGD{.learning_rate = 0.1})});
/// \endcode
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace strata::distribute {

namespace collective {
/// Settings the ranks of a job must share, as (name, value) text pairs (ProcessGroup::agree).
using Settings = std::vector<std::pair<std::string, std::string>>;
}  // namespace collective

namespace detail {
inline collective::Settings& job_settings_storage() {
    static collective::Settings s;  // one per program: an inline function's static is shared by every unit
    return s;
}
}  // namespace detail

/// The program's settings that every process of the job must share: whatever changes the
/// result or the files written (batch size, seed, steps, epochs, data size, which rank writes
/// which file, ...), as (name, value) text. Set once, before any strategy is built: every
/// collective::ProcessGroup compares them with its own when its ranks join, so every strategy
/// across processes (MultiWorkerMirrored, ParameterServer, Pipeline and the hybrid, and any
/// later one, since they all join through a ProcessGroup) refuses a mismatch before anything
/// else crosses processes: a ValueError on every rank naming each setting and which rank has
/// what (`--seed: rank 0 has 42, rank 1 has 7`). A strategy's own settings (its options) are
/// compared beside them; this is for what the program knows and the strategy does not.
///
/// \code
///   strata::distribute::set_job_settings({{"--batch-size", "128"}, {"--seed", "42"}});
/// \endcode
inline void set_job_settings(collective::Settings settings) { detail::job_settings_storage() = std::move(settings); }
/// The settings set_job_settings() gave (empty if none).
inline const collective::Settings& job_settings() { return detail::job_settings_storage(); }

namespace detail {
// FNV-1a of `n` bytes, as 16 hex digits.
inline std::string fnv1a_hex(const void* bytes, std::size_t n) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto* p = static_cast<const unsigned char*>(bytes);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}
// The model's spec as the compiler spells its type (every template argument, options included);
// no RTTI needed.
template <class Net>
const char* spec_text() {
    return __PRETTY_FUNCTION__;
}
// "121930 parameters, summary 0x…, spec 0x…": FNV-1a of the model's summary table, and of its
// spec's type, which also tells apart what the summary does not show and the variables do not
// change (a causal mask, a dropout rate, Embedding's mask_zero). A job's processes run one
// build of the program, or builds by one compiler, so they spell the type alike.
template <class Net>
std::string model_signature() {
    const auto summary = Net::summary();
    const std::string spec = spec_text<Net>();
    return std::to_string(Net::num_params) + " parameters, summary " + fnv1a_hex(summary.data(), summary.size()) + ", spec " +
           fnv1a_hex(spec.data(), spec.size());
}
// The model as the processes compare it when it is built: its signature and element type.
template <class Net, class T>
collective::Settings model_settings() {
    return {{"model", model_signature<Net>()}, {"dtype", std::is_same_v<T, float> ? "float32" : "float64"}};
}
}  // namespace detail

}  // namespace strata::distribute
