#pragma once
// Counts every heap allocation of the test program that includes this header: every operator new
// and every aligned_alloc (strata's tensors' host memory, 64-byte aligned, comes from it: this
// definition stands in for the C library's weak one and passes on to memalign). Include it from
// exactly one translation unit of a program: it defines the replaceable allocation functions.
#include <atomic>
#include <cstdlib>
#include <malloc.h>
#include <new>

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace strata_test {
inline std::atomic<long> allocations{0};
}  // namespace strata_test

void* operator new(std::size_t n) {
    strata_test::allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
extern "C" void* aligned_alloc(std::size_t alignment, std::size_t n) noexcept {
    strata_test::allocations.fetch_add(1, std::memory_order_relaxed);
    return memalign(alignment, n);
}
