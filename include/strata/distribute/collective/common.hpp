#pragma once
/// \file strata/distribute/collective/common.hpp
/// What every shared-memory collective algorithm shares: the algorithm and reduction names,
/// the element types they accept, how a buffer is cut into chunks, the view of one collective
/// call that an algorithm works on (Exchange), and the vectorised reduction kernels.
/// Users include strata/distribute/collective/all_reduce.hpp, which includes this file.

#include <strata/config.hpp>
#include <strata/core/error.hpp>
#include <strata/distribute/rendezvous.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace strata::distribute::collective {

/// The all-reduce algorithm.
/// - Ring: bandwidth-optimal ring (reduce-scatter + all-gather), see ring.hpp.
/// - NaiveRing: partial sums passed around the ring once, then the result; see naive_ring.hpp.
/// - Direct: every rank reduces its 1/N slice from all buffers, then copies the others;
///   see direct.hpp.
/// - Auto: the best choice for where the buffers live; for replicas sharing one memory
///   (this ReplicaGroup) that is Direct (see ReplicaGroup::resolve for why).
enum class Algorithm { Ring, NaiveRing, Direct, Auto };

/// The reduction. Mean is Sum followed by one division by the number of replicas
/// (a division, not a multiplication by 1/N, so that Mean of N equal values is exact).
enum class ReduceOp { Sum, Mean };

/// The name used in messages and benchmark tables: "ring", "naive_ring", "direct", "auto".
[[nodiscard]] constexpr std::string_view to_string(Algorithm a) noexcept {
    switch (a) {
        case Algorithm::Ring: return "ring";
        case Algorithm::NaiveRing: return "naive_ring";
        case Algorithm::Direct: return "direct";
        case Algorithm::Auto: return "auto";
    }
    return "unknown";
}

/// "sum" or "mean".
[[nodiscard]] constexpr std::string_view to_string(ReduceOp op) noexcept {
    return op == ReduceOp::Sum ? "sum" : "mean";
}

/// The element types the host collectives reduce: float and double.
template <class T>
concept Reducible = std::same_as<T, float> || std::same_as<T, double>;

/// First element of chunk `c` when `length` elements are cut into `parts` chunks whose sizes
/// differ by at most one (the first `length % parts` chunks are one longer).
/// Requires parts >= 1 and 0 <= c <= parts; chunk_begin(length, parts, parts) == length.
[[nodiscard]] constexpr std::size_t chunk_begin(std::size_t length, int parts, int c) noexcept {
    const auto p = static_cast<std::size_t>(parts);
    const auto i = static_cast<std::size_t>(c);
    const std::size_t base = length / p;
    const std::size_t extra = length % p;
    return i * base + (i < extra ? i : extra);
}

namespace detail {

/// What one rank published for one collective call (see ReplicaGroup).
struct alignas(64) Slot {
    enum class Kind : std::uint8_t { AllReduce, Broadcast, Barrier };
    enum class Type : std::uint8_t { Float, Double };
    std::uint64_t call = 0;  // this rank's collective call count, to catch calls out of order
    void* data = nullptr;
    std::size_t length = 0;
    std::int64_t bucket = -1;
    int root = 0;
    Kind kind = Kind::AllReduce;
    Type type = Type::Float;
    ReduceOp op = ReduceOp::Sum;
    Algorithm algorithm = Algorithm::Direct;
};

template <Reducible T>
constexpr Slot::Type type_of = std::same_as<T, float> ? Slot::Type::Float : Slot::Type::Double;

// The kernels below work in blocks of kLanes elements with a fixed-trip inner loop: g++ -O2
// (GCC 12's "very cheap" vectoriser cost model) does not vectorise a loop of unknown trip
// count that needs a scalar epilogue, but it does fully unroll and SLP-vectorise a fixed
// 16-iteration body. No OpenMP pragma is needed, so no flag is either.
inline constexpr std::size_t kLanes = 16;

/// dst[i] += src[i]. Requires dst and src not to overlap.
template <Reducible T>
inline void add_into(T* __restrict dst, const T* __restrict src, std::size_t n) noexcept {
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (std::size_t j = 0; j < kLanes; ++j) dst[i + j] += src[i + j];
    for (; i < n; ++i) dst[i] += src[i];
}

/// dst[i] = (dst[i] + src[i]) / divisor. Requires dst and src not to overlap.
template <Reducible T>
inline void add_into_divided(T* __restrict dst, const T* __restrict src, std::size_t n,
                             T divisor) noexcept {
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (std::size_t j = 0; j < kLanes; ++j) dst[i + j] = (dst[i + j] + src[i + j]) / divisor;
    for (; i < n; ++i) dst[i] = (dst[i] + src[i]) / divisor;
}

/// dst[i] = a[i] + b[i]. Requires dst to overlap neither a nor b.
template <Reducible T>
inline void sum_of(T* __restrict dst, const T* __restrict a, const T* __restrict b,
                   std::size_t n) noexcept {
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (std::size_t j = 0; j < kLanes; ++j) dst[i + j] = a[i + j] + b[i + j];
    for (; i < n; ++i) dst[i] = a[i] + b[i];
}

/// dst[i] = src[i] / divisor. Requires dst and src not to overlap.
template <Reducible T>
inline void divided(T* __restrict dst, const T* __restrict src, std::size_t n,
                    T divisor) noexcept {
    std::size_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
        for (std::size_t j = 0; j < kLanes; ++j) dst[i + j] = src[i + j] / divisor;
    for (; i < n; ++i) dst[i] = src[i] / divisor;
}

/// Copies at least this large bypass the caches (copy below).
inline constexpr std::size_t kStreamBytes = std::size_t(1) << 20;

/// dst[0, n) = src[0, n). Requires no overlap.
///
/// A copy of kStreamBytes or more (larger than a core's L2, so it would evict its own start)
/// writes with non-temporal stores on x86-64: an ordinary store first reads the line it
/// writes (write-allocate), so a cached copy moves three bytes through memory per byte copied
/// and a streaming one two. A store fence ends it, so that the barrier that publishes the
/// copy to the other ranks orders after it.
template <Reducible T>
inline void copy(T* dst, const T* src, std::size_t n) noexcept {
    const std::size_t bytes = n * sizeof(T);
#if defined(__x86_64__) || defined(_M_X64)
    if (bytes >= kStreamBytes) {
        auto* d = reinterpret_cast<unsigned char*>(dst);
        const auto* s = reinterpret_cast<const unsigned char*>(src);
        // Head: up to the first 16-byte boundary of dst (elements are 4 or 8 bytes, so
        // dst's misalignment is a multiple of 4).
        const std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
        std::memcpy(d, s, head);
        std::size_t i = head;
        for (; i + 64 <= bytes; i += 64) {
            const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
            const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
            const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
            _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
            _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
            _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
            _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
        }
        std::memcpy(d + i, s + i, bytes - i);
        _mm_sfence();
        return;
    }
#endif
    if (n != 0) std::memcpy(dst, src, bytes);
}

}  // namespace detail

/// The view one rank has of one collective call: every rank's buffer (all the same length,
/// already validated), its own rank, and the barrier between steps.
///
/// Represents: the "network" of a shared-memory collective. Buffer q belongs to rank q. An
/// algorithm may read any buffer; it writes its own, or elements of another rank's buffer that
/// no other rank reads or writes during the call (the one-shot direct algorithm writes its
/// slice of every buffer); and it puts a step() between a write and another rank's read of
/// the same elements. Every rank's buffer is ready when the Exchange is made, and the call's
/// last step() is its exit: after it nobody touches another rank's buffer. The Exchange is valid only inside the
/// ReplicaGroup call that made it.
template <Reducible T>
class Exchange {
public:
    Exchange(const detail::Slot* slots, int size, int rank, std::size_t length,
             Rendezvous& rendezvous, SyncPoint at) noexcept
        : slots_(slots), size_(size), rank_(rank), length_(length), rv_(&rendezvous), at_(at) {}

    [[nodiscard]] int size() const noexcept { return size_; }
    [[nodiscard]] int rank() const noexcept { return rank_; }
    [[nodiscard]] std::size_t length() const noexcept { return length_; }
    /// Rank q's buffer.
    [[nodiscard]] T* buffer(int q) const noexcept {
        return static_cast<T*>(slots_[static_cast<std::size_t>(q)].data);
    }
    [[nodiscard]] T* mine() const noexcept { return buffer(rank_); }
    /// Rank q modulo size, for ring neighbours (q may be negative).
    [[nodiscard]] int wrap(int q) const noexcept { return ((q % size_) + size_) % size_; }
    [[nodiscard]] std::size_t chunk_begin(int c) const noexcept {
        return collective::chunk_begin(length_, size_, c);
    }
    [[nodiscard]] std::size_t chunk_size(int c) const noexcept {
        return chunk_begin(c + 1) - chunk_begin(c);
    }
    /// Ends step `step` of `steps`: waits for every rank (named in a timeout or abort error).
    void step(int step, int steps) const {
        SyncPoint at = at_;
        at.step = step;
        at.steps = steps;
        rv_->arrive_and_wait(rank_, at);
    }

private:
    const detail::Slot* slots_;
    int size_;
    int rank_;
    std::size_t length_;
    Rendezvous* rv_;
    SyncPoint at_;
};

}  // namespace strata::distribute::collective
