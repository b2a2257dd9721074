#pragma once
/// \file strata/distribute/settings.hpp
/// What the processes of a job compare before they train together, as (name, value) text:
/// the Settings type and a model's signature (an optimizer reads as optim::describe). The
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
// FNV-1a of `n` bytes, as 16 hex digits.
inline std::string fnv1a_hex(const void* bytes, std::size_t n) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto* p = static_cast<const unsigned char*>(bytes);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}
// "121930 parameters, summary 0x…": FNV-1a of the model's summary table.
template <class Net>
std::string model_signature() {
    const auto summary = Net::summary();
    return std::to_string(Net::num_params) + " parameters, summary " + fnv1a_hex(summary.data(), summary.size());
}
// The model as the processes compare it when it is built: its signature and element type.
template <class Net, class T>
collective::Settings model_settings() {
    return {{"model", model_signature<Net>()}, {"dtype", std::is_same_v<T, float> ? "float32" : "float64"}};
}
}  // namespace detail

}  // namespace strata::distribute
