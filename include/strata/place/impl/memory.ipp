#pragma once
/// \file strata/place/impl/memory.ipp
/// The definitions behind strata/place/memory.hpp: included by it in the header-only mode,
/// compiled once in src/strata.cpp under STRATA_SEPARATE_COMPILATION.

#include "strata/place/memory.hpp"

namespace strata::place {

STRATA_DECL void* DeviceAllocator::allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    const std::size_t rounded = round(bytes);
    void* p = nullptr;
    {
        std::lock_guard lock(mu_);
        p = acquire(rounded, bytes);
        in_use_ += rounded;
        peak_ = std::max(peak_, in_use_);
    }
    try {
        auto& reg = detail::owner_registry();
        std::lock_guard lock(reg.mu);
        reg.blocks.emplace(p, detail::BlockOwner{this, rounded});
        reg.live.fetch_add(1, std::memory_order_release);
    } catch (...) {
        std::lock_guard lock(mu_);
        in_use_ -= rounded;
        release(p, rounded);
        throw;
    }
    return p;
}

namespace detail {
STRATA_DECL bool return_to_owner(void* p) noexcept {
    if (!p) return false;
    auto& reg = owner_registry();
    if (reg.live.load(std::memory_order_acquire) == 0) return false;
    BlockOwner owner;
    {
        std::lock_guard lock(reg.mu);
        auto it = reg.blocks.find(p);
        if (it == reg.blocks.end()) return false;
        owner = it->second;
        reg.blocks.erase(it);
        reg.live.fetch_sub(1, std::memory_order_relaxed);
    }
    owner.owner->deallocate(p, owner.size);
    return true;
}
}  // namespace detail

}  // namespace strata::place
