#pragma once
/// \file strata/core/profile.hpp
/// A step profiler: where the time of a training or inference step goes, layer by layer and
/// phase by phase (forward; backward split into the activation's gradient, the weight gradient
/// and the data gradient; loss; optimizer; input pipeline; all-reduce).
///
/// It is a compile-time switch. Define `STRATA_PROFILE` to 1 before including strata (or pass
/// `-DSTRATA_PROFILE=1`) in one program, and the library's probes record; without it every probe
/// is an empty statement and the functions below report nothing, so a normal build pays nothing.
/// The whole program must agree on the setting (it changes inline functions).
///
/// \code
///   #define STRATA_PROFILE 1
///   #include <strata/strata.hpp>
///   ...
///   strata::profile::reset();
///   model.fit(train, {.epochs = 1, .steps_per_epoch = 100});
///   for (const auto& r : strata::profile::rows())
///       std::printf("%-24s %-20s %8.3f ms %6lld calls\n", r.group.c_str(), r.phase.c_str(),
///                   r.seconds * 1e3, (long long)r.calls);
/// \endcode
///
/// Time. A probe on a thread outside any parallel region records wall time. A probe inside an
/// OpenMP parallel region (the blocked convolution's per-chunk phases) records its thread's time
/// divided by the team's size, so that a phase spread evenly over the team adds up to its wall
/// time and phases that interleave inside one loop are still told apart. Probes on the host
/// measure host work: a CUDA kernel launch returns before the kernel ends, so on a GPU the
/// figures are launch times, not kernel times.
///
/// Groups. A probe names its group by an address or by a fixed name ("model").
/// `label(object, name, order)` gives an address's group its name and its place in the report.
/// A Network labels one address per layer as summary() names the layers (not the layer objects'
/// own addresses: layers without members may share theirs) and makes it the current() group
/// while the layer runs, so that the layer's probes need no address. Groups with the same name
/// (the same layer in several replicas) are merged.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#if STRATA_HAS_OPENMP
#include <omp.h>
#endif

#ifndef STRATA_PROFILE
#define STRATA_PROFILE 0
#endif

namespace strata::profile {

/// Whether this program was compiled with the probes on (`STRATA_PROFILE`).
inline constexpr bool enabled = STRATA_PROFILE != 0;

}  // namespace strata::profile

// The probes change the layout of the classes they live in (Network holds one key per layer when
// they are on), so a unit compiled with STRATA_PROFILE=1 must not share strata's code with one
// compiled without: with the compiled part, libstrata (src/strata.cpp) defines the one of these
// two symbols that says how it was built, and every unit that uses it refers to the one that
// says how the unit was built. A mismatch is a link error naming the setting
// ("undefined reference to `strata::detail::compiled_part_built_with_STRATA_PROFILE_1'"), not
// a program that corrupts memory. (Header-only units each compile their own code; mixing the
// setting across them in one program is not checked: use one setting per program.)
namespace strata::detail {
#if STRATA_PROFILE
extern const int compiled_part_built_with_STRATA_PROFILE_1;
#else
extern const int compiled_part_built_with_STRATA_PROFILE_0;
#endif
}  // namespace strata::detail
#if defined(STRATA_BUILDING_COMPILED_PART)
namespace strata::detail {
#if STRATA_PROFILE
extern const int compiled_part_built_with_STRATA_PROFILE_1 = 1;
#else
extern const int compiled_part_built_with_STRATA_PROFILE_0 = 0;
#endif
}  // namespace strata::detail
#elif !STRATA_HEADER_ONLY && defined(__GNUC__)
namespace {
#if STRATA_PROFILE
[[maybe_unused]] __attribute__((used)) const int* const strata_profile_setting = &strata::detail::compiled_part_built_with_STRATA_PROFILE_1;
#else
[[maybe_unused]] __attribute__((used)) const int* const strata_profile_setting = &strata::detail::compiled_part_built_with_STRATA_PROFILE_0;
#endif
}  // namespace
#endif

namespace strata::profile {

/// One line of the report: the time a phase of a group took, summed over its calls.
struct Row {
    std::string group;  ///< "conv2d_1", "model", ...
    std::string phase;  ///< "forward", "backward.weights", "loss", ...
    double seconds = 0;
    std::int64_t calls = 0;
    int order = 0;      ///< the group's place in the report (a layer's index; model last)
};

namespace detail {

struct Slot {
    const void* object;
    const char* phase;
    double seconds;
    std::int64_t calls;
};

// What one thread recorded. Only its thread writes it; reading it (rows, reset) takes its mutex,
// which the writer also takes (uncontended, except while a report is made).
struct Table {
    std::mutex m;
    std::vector<Slot> slots;
};

struct Label {
    const void* object;
    std::string name;
    int order;
};

struct Registry {
    std::mutex m;
    std::vector<std::shared_ptr<Table>> tables;
    std::vector<Label> labels;
    static Registry& get() {
        static Registry r;
        return r;
    }
};

inline Table& table() {
    thread_local std::shared_ptr<Table> mine = [] {
        auto t = std::make_shared<Table>();
        auto& reg = Registry::get();
        std::lock_guard lock(reg.m);
        reg.tables.push_back(t);
        return t;
    }();
    return *mine;
}

inline void record(const void* object, const char* phase, double seconds) {
    Table& t = table();
    std::lock_guard lock(t.m);
    for (auto& s : t.slots)
        if (s.object == object && s.phase == phase) {
            s.seconds += seconds;
            ++s.calls;
            return;
        }
    t.slots.push_back({object, phase, seconds, 1});
}

// The group every probe without an object records under.
inline const char model_group = 0;

// The group the calling thread's layer probes record under (set by GroupScope).
inline thread_local const void* current_group = nullptr;

}  // namespace detail

/// The group the calling thread is in (the layer a Network is running), or nullptr; a layer's
/// parallel loop reads it before the loop and hands it to the probes inside.
inline const void* current() noexcept {
    if constexpr (enabled) return detail::current_group;
    else return nullptr;
}

/// Times the scope it lives in as phase `phase` (a string literal) of `object`'s group.
class Scope {
public:
    Scope(const void* object, const char* phase) noexcept
        : object_(object), phase_(phase), start_(std::chrono::steady_clock::now()) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
#if STRATA_HAS_OPENMP
        if (omp_in_parallel()) s /= double(omp_get_num_threads());
#endif
        try {
            detail::record(object_, phase_, s);
        } catch (...) {  // out of memory for a new slot: the figure is lost, the program is not
        }
    }

private:
    const void* object_;
    const char* phase_;
    std::chrono::steady_clock::time_point start_;
};

/// A Scope that also makes `object` the calling thread's current() group while it lasts: a
/// Network wraps each layer's forward and backward in one, so that the layer's own probes
/// (STRATA_PROFILE_PHASE) record under it.
class GroupScope {
public:
    GroupScope(const void* object, const char* phase) noexcept
        : previous_(std::exchange(detail::current_group, object)), scope_(object, phase) {}
    GroupScope(const GroupScope&) = delete;
    GroupScope& operator=(const GroupScope&) = delete;
    ~GroupScope() { detail::current_group = previous_; }

private:
    const void* previous_;
    Scope scope_;
};

/// Names `object`'s group in the report and gives it its place (lower first).
inline void label(const void* object, std::string name, int order) {
    if constexpr (!enabled) return;
    auto& reg = detail::Registry::get();
    std::lock_guard lock(reg.m);
    for (auto& l : reg.labels)
        if (l.object == object) {
            l.name = std::move(name);
            l.order = order;
            return;
        }
    reg.labels.push_back({object, std::move(name), order});
}

/// Forgets what was recorded (labels are kept).
inline void reset() {
    auto& reg = detail::Registry::get();
    std::lock_guard lock(reg.m);
    for (auto& t : reg.tables) {
        std::lock_guard tl(t->m);
        t->slots.clear();
    }
}

/// What was recorded since the last reset, summed over threads and over groups of the same
/// name, in report order (groups by `order`, phases as first recorded). Empty when the
/// program was compiled without STRATA_PROFILE.
inline std::vector<Row> rows() {
    std::vector<Row> out;
    auto& reg = detail::Registry::get();
    std::lock_guard lock(reg.m);
    auto name_of = [&](const void* object, int& order) -> std::string {
        if (object == &detail::model_group) {
            order = 1 << 30;
            return "model";
        }
        for (const auto& l : reg.labels)
            if (l.object == object) {
                order = l.order;
                return l.name;
            }
        order = (1 << 30) - 1;
        return "(unlabelled)";
    };
    for (auto& t : reg.tables) {
        std::lock_guard tl(t->m);
        for (const auto& s : t->slots) {
            int order = 0;
            std::string group = name_of(s.object, order);
            auto it = std::find_if(out.begin(), out.end(),
                                   [&](const Row& r) { return r.group == group && r.phase == s.phase; });
            if (it == out.end()) out.push_back({std::move(group), s.phase, s.seconds, s.calls, order});
            else {
                it->seconds += s.seconds;
                it->calls += s.calls;
            }
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.order < b.order; });
    return out;
}

}  // namespace strata::profile

#define STRATA_PROFILE_CAT2(a, b) a##b
#define STRATA_PROFILE_CAT(a, b) STRATA_PROFILE_CAT2(a, b)
#if STRATA_PROFILE
/// Times the rest of the enclosing scope as phase `phase` of `object`'s group (a no-op unless
/// STRATA_PROFILE is on).
#define STRATA_PROFILE_SCOPE(object, phase) \
    const ::strata::profile::Scope STRATA_PROFILE_CAT(strata_profile_scope_, __LINE__)(object, phase)
/// Times the rest of the enclosing scope as phase `phase` of the "model" group.
#define STRATA_PROFILE_MODEL(phase) STRATA_PROFILE_SCOPE(&::strata::profile::detail::model_group, phase)
/// Times the rest of the enclosing scope as phase `phase` of `object`'s group, which is the
/// thread's current() group meanwhile (a Network around each layer call).
#define STRATA_PROFILE_GROUP(object, phase) \
    const ::strata::profile::GroupScope STRATA_PROFILE_CAT(strata_profile_scope_, __LINE__)(object, phase)
/// Times the rest of the enclosing scope as phase `phase` of the current() group (inside a
/// layer's forward or backward).
#define STRATA_PROFILE_PHASE(phase) STRATA_PROFILE_SCOPE(::strata::profile::current(), phase)
#else
#define STRATA_PROFILE_SCOPE(object, phase) static_cast<void>(0)
#define STRATA_PROFILE_MODEL(phase) static_cast<void>(0)
#define STRATA_PROFILE_GROUP(object, phase) static_cast<void>(0)
#define STRATA_PROFILE_PHASE(phase) static_cast<void>(0)
#endif
