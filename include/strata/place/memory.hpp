#pragma once
/// \file strata/place/memory.hpp
/// Memory policies of logical devices: the allocators behind `place::Host::allocate` and
/// `place::Cuda::allocate` while a `DeviceScope` is active on the calling thread.
///
/// Three policies, chosen per logical device from its configuration (see strata/place/devices.hpp,
/// which holds the user-facing calls `set_memory_growth`, `memory_info`, `reset_memory_stats`):
///
/// | policy  | chosen when                                   | what it does                                    |
/// |---------|-----------------------------------------------|-------------------------------------------------|
/// | Direct  | no memory growth, no memory limit (default)   | one upstream allocation per block; counts bytes |
/// | Growth  | `set_memory_growth(physical, true)`           | caching pool: freed blocks kept per size class  |
/// |         |                                               | and reused; grows on demand (up to the limit)   |
/// | Fixed   | a `memory_limit` and no memory growth         | the whole limit reserved up front as one arena; |
/// |         |                                               | blocks carved best-fit, freed blocks coalesced  |
///
/// Every block handed out is recorded with its owner, so a tensor allocated inside one scope
/// and freed in another, outside any scope, or on another thread goes back to the allocator
/// that gave it. This header depends on nothing above `core/`: place.hpp includes it.

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"

namespace strata::place {

/// Which memory a device allocator serves: host RAM or one GPU's memory.
enum class MemorySpace { Host, Gpu };

/// How a logical device hands out memory (see the table at the top of this file).
enum class MemoryPolicy { Direct, Growth, Fixed };

/// The name of a policy: "direct", "growth" or "fixed".
inline const char* policy_name(MemoryPolicy p) {
    switch (p) {
        case MemoryPolicy::Direct: return "direct";
        case MemoryPolicy::Growth: return "growth";
        case MemoryPolicy::Fixed: return "fixed";
    }
    return "?";
}

/// Memory statistics of one logical device, in bytes (TensorFlow's `get_memory_info`, plus two).
///
/// - `current`: bytes held by live blocks (each block counted at its rounded size);
/// - `peak`: the largest `current` since the allocator was made or `reset_memory_stats`;
/// - `reserved`: bytes taken from the system: `current` plus cached free blocks (Growth) or the
///   whole arena (Fixed);
/// - `limit`: the configured memory limit, 0 for none.
struct MemoryInfo {
    std::size_t current = 0;
    std::size_t peak = 0;
    std::size_t reserved = 0;
    std::size_t limit = 0;
};

/// A byte count for messages: "512 bytes", "64 KiB", "1.5 MiB", "230 MiB".
inline std::string format_bytes(std::size_t n) {
    static const char* const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (n < 1024) return std::to_string(n) + " bytes";
    double v = double(n);
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        ++u;
    }
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.1f", v);
    std::string s = buf;
    if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
    return s + " " + units[u];
}

/// Where an allocator gets its memory from: host RAM (64-byte aligned) or a GPU (cudaMalloc).
/// Both functions return nullptr / ignore nullptr instead of throwing.
struct Upstream {
    void* (*allocate)(std::size_t bytes) noexcept = nullptr;
    void (*deallocate)(void* p) noexcept = nullptr;
};

namespace detail {
inline void* host_upstream_allocate(std::size_t bytes) noexcept {
    // 64-byte alignment: a cache line, and what AVX-512 loads like (aligned_alloc needs a
    // multiple of the alignment).
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    return rounded ? std::aligned_alloc(64, rounded) : nullptr;
}
inline void host_upstream_deallocate(void* p) noexcept { std::free(p); }
}  // namespace detail

/// Host RAM, 64-byte aligned (what `place::Host` allocates outside any DeviceScope).
inline Upstream host_upstream() { return {&detail::host_upstream_allocate, &detail::host_upstream_deallocate}; }

class DeviceAllocator;

namespace detail {

struct BlockOwner {
    DeviceAllocator* owner = nullptr;
    std::size_t size = 0;  // the rounded size the owner handed out
};

// Every block an allocator hands out, with its owner. `live` lets frees of ordinary blocks skip
// the lock entirely while no device block exists.
struct OwnerRegistry {
    std::mutex mu;
    std::unordered_map<void*, BlockOwner> blocks;
    std::atomic<std::size_t> live{0};
};

// Never destroyed: tensors with static storage may be freed after main returns.
inline OwnerRegistry& owner_registry() {
    static OwnerRegistry* r = new OwnerRegistry;
    return *r;
}

/// The allocator serving `space` on this thread (set by DeviceScope), or nullptr.
inline DeviceAllocator*& current_allocator(MemorySpace space) noexcept {
    thread_local DeviceAllocator* slots[2] = {nullptr, nullptr};
    return slots[space == MemorySpace::Host ? 0 : 1];
}

/// If `p` came from a device allocator, gives it back to that allocator and returns true;
/// returns false for memory strata's allocators do not own (then the caller frees it).
STRATA_DECL bool return_to_owner(void* p) noexcept;

}  // namespace detail

/// One logical device's allocator: the memory policy plus the statistics. Thread-safe.
///
/// Requires: blocks are returned through `detail::return_to_owner` (place::Host/Cuda::deallocate
/// do that), never with free/cudaFree directly.
/// Ensures: blocks are 64-byte aligned (host) or 256-byte aligned (GPU arena; cudaMalloc blocks
/// are 256-byte aligned themselves); `info()` is exact at every moment.
///
/// \code
/// strata::place::CachingPool pool("/device:CPU:0", strata::place::host_upstream());
/// void* p = pool.allocate(1000);                    // a 1024-byte block, kept after the free
/// strata::place::detail::return_to_owner(p);
/// \endcode
class DeviceAllocator {
public:
    DeviceAllocator(std::string device, Upstream upstream, std::size_t limit)
        : device_(std::move(device)), up_(upstream), limit_(limit) {}
    virtual ~DeviceAllocator() = default;
    DeviceAllocator(const DeviceAllocator&) = delete;
    DeviceAllocator& operator=(const DeviceAllocator&) = delete;

    /// A block of at least `bytes` bytes (nullptr for 0). Throws DeviceError naming the device,
    /// the request and the bytes in use when the policy or the system cannot serve it.
    STRATA_DECL void* allocate(std::size_t bytes);

    /// Statistics now.
    MemoryInfo info() const {
        std::lock_guard lock(mu_);
        return {in_use_, peak_, reserved_, limit_};
    }
    /// Sets the peak to the bytes in use now (TensorFlow's `reset_memory_stats`).
    void reset_peak() {
        std::lock_guard lock(mu_);
        peak_ = in_use_;
    }
    /// Takes what the policy takes up front (the Fixed arena); nothing for the others.
    void reserve() {
        std::lock_guard lock(mu_);
        reserve_locked();
    }
    /// Gives cached free blocks back to the system (Growth); nothing for the others.
    void release_cached() noexcept {
        std::lock_guard lock(mu_);
        release_cached_locked();
    }
    /// After a reconfiguration: no new blocks come from here; blocks still out are freed to the
    /// system as they come back, and the arena when the last one has.
    void retire() noexcept {
        std::lock_guard lock(mu_);
        retired_ = true;
        release_cached_locked();
        if (in_use_ == 0) release_reservation_locked();
    }

    const std::string& device() const { return device_; }
    std::size_t limit() const { return limit_; }
    virtual MemoryPolicy policy() const = 0;

    /// Called by detail::return_to_owner with the size recorded at allocation.
    void deallocate(void* p, std::size_t rounded) noexcept {
        std::lock_guard lock(mu_);
        in_use_ -= rounded;
        release(p, rounded);
        if (retired_) {
            release_cached_locked();
            if (in_use_ == 0) release_reservation_locked();
        }
    }

protected:
    /// The size a request is served with (a multiple of 64).
    virtual std::size_t round(std::size_t bytes) const = 0;
    // The policy's own work; called with mu_ held.
    virtual void* acquire(std::size_t rounded, std::size_t requested) = 0;
    virtual void release(void* p, std::size_t rounded) noexcept = 0;
    virtual void reserve_locked() {}
    virtual void release_cached_locked() noexcept {}
    virtual void release_reservation_locked() noexcept {}

    [[noreturn]] void out_of_limit(std::size_t requested, const std::string& detail = {}) const {
        throw_error<DeviceError>(device_, ": out of its ", format_bytes(limit_), " memory limit: requested ",
                                 format_bytes(requested), " with ", format_bytes(in_use_), " in use", detail);
    }
    [[noreturn]] void out_of_memory(std::size_t requested) const {
        throw_error<DeviceError>(device_, ": out of memory: requested ", format_bytes(requested), " with ",
                                 format_bytes(in_use_), " in use and ", format_bytes(reserved_),
                                 " reserved (", policy_name(policy()), " policy)");
    }
    // Upstream allocation; on failure the caller decides (release caches, throw).
    void* upstream_allocate(std::size_t bytes) noexcept { return up_.allocate ? up_.allocate(bytes) : nullptr; }
    void upstream_deallocate(void* p) noexcept {
        if (p && up_.deallocate) up_.deallocate(p);
    }

    mutable std::mutex mu_;
    std::string device_;
    Upstream up_;
    std::size_t limit_ = 0;
    std::size_t in_use_ = 0;
    std::size_t peak_ = 0;
    std::size_t reserved_ = 0;
    bool retired_ = false;
};

/// The Direct policy: one upstream allocation per block, returned to the system when freed;
/// only counts bytes (so `memory_info` works on every device).
class DirectAllocator final : public DeviceAllocator {
public:
    DirectAllocator(std::string device, Upstream upstream) : DeviceAllocator(std::move(device), upstream, 0) {}
    MemoryPolicy policy() const override { return MemoryPolicy::Direct; }

protected:
    std::size_t round(std::size_t bytes) const override { return (bytes + 63) / 64 * 64; }
    void* acquire(std::size_t rounded, std::size_t requested) override {
        void* p = upstream_allocate(rounded);
        if (!p) out_of_memory(requested);
        reserved_ += rounded;
        return p;
    }
    void release(void* p, std::size_t rounded) noexcept override {
        upstream_deallocate(p);
        reserved_ -= rounded;
    }
};

/// The Growth policy: a caching pool. A request is rounded up to its size class (four classes
/// per power of two, so at most 25% slack; 256 bytes at least); a freed block is kept in its
/// class's free list and reused by the next request of that class. The pool grows as needed;
/// with a limit (`limit > 0`) it first gives its cached blocks back, then throws DeviceError.
///
/// Ensures: allocating and freeing the same size over and over takes memory from the system once
/// (reserved and peak stay put).
class CachingPool final : public DeviceAllocator {
public:
    CachingPool(std::string device, Upstream upstream, std::size_t limit = 0)
        : DeviceAllocator(std::move(device), upstream, limit) {}
    ~CachingPool() override { release_cached_locked(); }
    MemoryPolicy policy() const override { return MemoryPolicy::Growth; }

    /// The size class of a request: 256 bytes, or 2^k·{1, 1.25, 1.5, 1.75} rounded up.
    static std::size_t size_class(std::size_t bytes) {
        if (bytes <= 256) return 256;
        const int k = int(std::bit_width(bytes - 1)) - 1;  // 2^k < bytes <= 2^(k+1)
        const std::size_t step = (std::size_t(1) << k) / 4;
        return (bytes + step - 1) / step * step;
    }

protected:
    std::size_t round(std::size_t bytes) const override { return size_class(bytes); }
    void* acquire(std::size_t rounded, std::size_t requested) override {
        if (auto it = free_.find(rounded); it != free_.end() && !it->second.empty()) {
            void* p = it->second.back();
            it->second.pop_back();
            return p;
        }
        if (limit_ && reserved_ + rounded > limit_) {
            release_cached_locked();
            if (reserved_ + rounded > limit_) out_of_limit(requested);
        }
        void* p = upstream_allocate(rounded);
        if (!p) {
            // Cached blocks of other classes may be what the system is missing.
            release_cached_locked();
            p = upstream_allocate(rounded);
            if (!p) out_of_memory(requested);
        }
        reserved_ += rounded;
        return p;
    }
    void release(void* p, std::size_t rounded) noexcept override {
        if (!retired_) {
            try {
                free_[rounded].push_back(p);
                return;
            } catch (...) {
                // No room to remember the block: give it back instead.
            }
        }
        upstream_deallocate(p);
        reserved_ -= rounded;
    }
    void release_cached_locked() noexcept override {
        for (auto& [size, blocks] : free_) {
            for (void* p : blocks) upstream_deallocate(p);
            reserved_ -= size * blocks.size();
        }
        free_.clear();
    }

private:
    std::map<std::size_t, std::vector<void*>> free_;
};

/// The Fixed policy: `limit` bytes taken from the system at once (on `reserve()`, which
/// DeviceScope calls on entry, or on the first allocation), blocks carved from that arena
/// best-fit (the smallest free range that fits), freed blocks merged with free neighbours.
/// A request that does not fit throws DeviceError:
/// `"/device:GPU:1: out of its 256 MiB memory limit: requested 64 MiB with 230 MiB in use"`.
class FixedArena final : public DeviceAllocator {
public:
    static constexpr std::size_t alignment = 256;

    FixedArena(std::string device, Upstream upstream, std::size_t limit)
        : DeviceAllocator(std::move(device), upstream, limit) {
        STRATA_CHECK(limit > 0, ValueError, device_, ": a fixed memory arena needs a memory limit > 0");
    }
    ~FixedArena() override { release_reservation_locked(); }
    MemoryPolicy policy() const override { return MemoryPolicy::Fixed; }

    /// The largest block the arena could hand out now (0 before it is reserved).
    std::size_t largest_free_block() const {
        std::lock_guard lock(mu_);
        return by_size_.empty() ? 0 : by_size_.rbegin()->first;
    }

protected:
    std::size_t round(std::size_t bytes) const override { return (bytes + alignment - 1) / alignment * alignment; }
    void reserve_locked() override {
        if (base_ || retired_) return;
        const std::size_t capacity = limit_ / alignment * alignment;
        STRATA_CHECK(capacity > 0, ValueError, device_, ": a memory limit of ", format_bytes(limit_),
                     " is smaller than one ", alignment, "-byte block");
        base_ = static_cast<std::byte*>(upstream_allocate(capacity));
        if (!base_)
            throw_error<DeviceError>(device_, ": could not reserve its ", format_bytes(limit_),
                                     " memory limit up front: the system refused ", format_bytes(capacity));
        capacity_ = capacity;
        reserved_ = capacity;
        insert_free(0, capacity);
    }
    void* acquire(std::size_t rounded, std::size_t requested) override {
        reserve_locked();
        if (in_use_ + rounded > capacity_) out_of_limit(requested);
        auto it = by_size_.lower_bound({rounded, 0});
        if (it == by_size_.end())
            out_of_limit(requested, "; the largest free block is " +
                                        format_bytes(by_size_.empty() ? 0 : by_size_.rbegin()->first) +
                                        " (the arena is fragmented)");
        const auto [size, offset] = *it;
        by_size_.erase(it);
        by_offset_.erase(offset);
        if (size > rounded) insert_free(offset + rounded, size - rounded);
        return base_ + offset;
    }
    void release(void* p, std::size_t rounded) noexcept override {
        std::size_t offset = std::size_t(static_cast<std::byte*>(p) - base_);
        std::size_t size = rounded;
        // Merge with the free range just after, then the one just before.
        if (auto next = by_offset_.find(offset + size); next != by_offset_.end()) {
            size += next->second;
            by_size_.erase({next->second, next->first});
            by_offset_.erase(next);
        }
        if (auto after = by_offset_.lower_bound(offset); after != by_offset_.begin()) {
            auto prev = std::prev(after);
            if (prev->first + prev->second == offset) {
                offset = prev->first;
                size += prev->second;
                by_size_.erase({prev->second, prev->first});
                by_offset_.erase(prev);
            }
        }
        insert_free(offset, size);
    }
    void release_reservation_locked() noexcept override {
        if (!base_) return;
        upstream_deallocate(base_);
        base_ = nullptr;
        reserved_ = 0;
        capacity_ = 0;
        by_offset_.clear();
        by_size_.clear();
    }

private:
    void insert_free(std::size_t offset, std::size_t size) noexcept {
        // Merging frees at most two nodes for the one it adds, so this rarely allocates; if
        // it cannot, the range is lost to this arena, never handed out twice.
        try {
            by_offset_.emplace(offset, size);
            try {
                by_size_.emplace(size, offset);
            } catch (...) {
                by_offset_.erase(offset);
            }
        } catch (...) {
        }
    }

    std::byte* base_ = nullptr;
    std::size_t capacity_ = 0;
    std::map<std::size_t, std::size_t> by_offset_;         // offset -> size of each free range
    std::set<std::pair<std::size_t, std::size_t>> by_size_;  // (size, offset), for best fit
};

}  // namespace strata::place

#if STRATA_DEFINITIONS
#include "strata/place/impl/memory.ipp"
#endif
