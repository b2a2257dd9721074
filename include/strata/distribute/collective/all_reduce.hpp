#pragma once
/// \file strata/distribute/collective/all_reduce.hpp
/// Collectives among the replicas (threads) of one process: all_reduce, broadcast, barrier,
/// with a timeout and an abort so that a failing or missing replica is an error on every
/// replica, never a hang.
///
/// \code
///   #include <strata/distribute/collective/all_reduce.hpp>
///   namespace coll = strata::distribute::collective;
///   coll::ReplicaGroup group(4);                      // 4 replicas, 60 s timeout
///   // in replica thread r, with its own std::vector<float> grad of the same length:
///   group.all_reduce(r, std::span<float>(grad), coll::ReduceOp::Mean);
/// \endcode

#include <strata/core/error.hpp>
#include <strata/distribute/collective/common.hpp>
#include <strata/distribute/collective/direct.hpp>
#include <strata/distribute/collective/naive_ring.hpp>
#include <strata/distribute/collective/ring.hpp>
#include <strata/distribute/rendezvous.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

namespace strata::distribute::collective {

class AsyncAllReduce;

/// A stage that carries a ReplicaGroup's all-reduce beyond its process (MultiWorkerMirrored's
/// cross-process all-reduce). `sum(self, lane, data, bucket)` sums `data` over the processes, in
/// place; lane = the calling replica, so the replicas' slices cross in parallel.
struct OuterStage {
    void* self = nullptr;
    void (*sum_float)(void* self, int lane, std::span<float> data, std::int64_t bucket) = nullptr;
    void (*sum_double)(void* self, int lane, std::span<double> data, std::int64_t bucket) = nullptr;
    int processes = 1;  ///< how many processes the stage spans (Mean divides by replicas × this)
    explicit operator bool() const noexcept { return self != nullptr; }
};

/// Options of a ReplicaGroup.
struct GroupOptions {
    /// How long a replica waits at any step of a collective for the others before the group
    /// fails with a DistributedError naming the missing replicas.
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

/// A communicator for N replicas of one process that share memory (host threads, logical
/// devices of one host).
///
/// Represents: N ranks 0..N-1, each driven by one thread that owns its own buffers. A
/// collective is called by all N ranks, each with its own buffer of the same length; the
/// calls pair up in program order (the k-th collective call of every rank is one collective).
///
/// Requires: every rank makes the same sequence of collective calls with the same arguments
/// (length, element type, op, algorithm, root); buffers of different ranks do not overlap;
/// a buffer is not touched by anyone else while its rank is inside a call.
///
/// Ensures:
/// - arguments that differ between ranks are detected on every rank, which all throw the same
///   error (ShapeError for lengths, naming both; DistributedError for the rest) and leave the
///   group usable;
/// - a rank that does not arrive within options.timeout makes the others throw
///   DistributedError naming it; a rank that calls abort() makes the others throw
///   DistributedError `replica R failed: <what>`. Either way the group stays aborted (every
///   call throws at once) until reset();
/// - results are bitwise reproducible run to run and bitwise identical on all ranks.
///
/// The usual replica thread body:
/// \code
///   try { step(rank); group.all_reduce(rank, std::span<float>(grads), ReduceOp::Mean); }
///   catch (...) { group.abort(rank, std::current_exception()); throw; }
/// \endcode
class ReplicaGroup {
public:
    /// Requires replicas >= 1 and options.timeout > 0 (ValueError otherwise).
    STRATA_DECL explicit ReplicaGroup(int replicas, GroupOptions options = {});
    ReplicaGroup(const ReplicaGroup&) = delete;
    ReplicaGroup& operator=(const ReplicaGroup&) = delete;

    /// Number of replicas N.
    [[nodiscard]] int size() const noexcept { return n_; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return rv_.timeout(); }

    /// The algorithm `a` stands for in this group: Auto is Direct. In shared memory there is
    /// no link whose bandwidth a ring would spread the traffic over; every rank reads the
    /// other buffers directly. Direct moves no more bytes than the ring ((3N-1)/N against
    /// 5(N-1)/N buffer sizes per rank, equal at N = 2) and needs 2 barriers where the ring
    /// needs 2(N-1), each a thread wake-up, costly when threads outnumber cores. Measured in
    /// docs/collectives.md.
    [[nodiscard]] static constexpr Algorithm resolve(Algorithm a) noexcept {
        return a == Algorithm::Auto ? Algorithm::Direct : a;
    }

    /// Reduces `data` element-wise across all ranks, in place: afterwards every rank's `data`
    /// holds sum_q data_q (ReduceOp::Sum) or that sum divided by N (ReduceOp::Mean).
    ///
    /// Requires: called by every rank with the same data.size(), T, op and algorithm.
    /// Throws: ShapeError when the lengths differ (on every rank, naming both lengths);
    /// DistributedError on a timeout, an abort, or other arguments that differ; ValueError for
    /// a rank outside [0, N). N = 1 returns at once.
    /// Example: `group.all_reduce(rank, std::span<double>(g), ReduceOp::Sum, Algorithm::Ring);`
    template <Reducible T>
    void all_reduce(int rank, std::span<T> data, ReduceOp op = ReduceOp::Sum,
                    Algorithm algorithm = Algorithm::Auto) {
        all_reduce_impl(rank, data, op, algorithm, -1);
    }

    /// Copies rank `root`'s `data` into every other rank's `data`.
    /// Requires: every rank passes the same length and root; 0 <= root < N.
    /// Throws as all_reduce (a root out of range is a DistributedError on every rank).
    /// Example: `group.broadcast(rank, std::span<float>(weights), 0);`
    template <Reducible T>
    void broadcast(int rank, std::span<T> data, int root = 0);

    /// Waits until every rank called barrier(). Throws as all_reduce.
    STRATA_DECL void barrier(int rank);

    /// Makes every all-reduce of this group hierarchical: each replica sums its slice of the
    /// group's buffers (the direct algorithm's reduce-scatter), hands that slice to `stage`
    /// (the sum across processes), and the replicas gather the slices back. Any Algorithm
    /// asked for runs this way. Call before any collective, with no replica inside one.
    void set_outer_stage(OuterStage stage) noexcept { outer_ = stage; }
    [[nodiscard]] const OuterStage& outer_stage() const noexcept { return outer_; }

    /// Marks the group failed because replica `rank` threw `error`: every rank waiting now or
    /// calling later throws DistributedError `... replica <rank> failed: <error.what()>`.
    /// The first failure wins. Never throws; call it from the replica's catch block.
    void abort(int rank, std::exception_ptr error) noexcept { rv_.abort(rank, std::move(error)); }
    /// As abort(rank, exception_ptr), with a message.
    void abort(int rank, std::string_view message) noexcept { rv_.abort(rank, message); }

    /// Makes an aborted (or timed-out) group usable again.
    /// Requires: no rank is inside a call of this group (join the replica threads first).
    STRATA_DECL void reset();

    /// True between an abort or a timeout and reset().
    [[nodiscard]] bool aborted() const { return rv_.aborted(); }
    /// The exception given to the first abort() (or the timeout error); null if none.
    [[nodiscard]] std::exception_ptr failure() const { return rv_.failure(); }
    /// The barrier every collective of this group synchronises through.
    [[nodiscard]] Rendezvous& rendezvous() noexcept { return rv_; }

private:
    friend class AsyncAllReduce;
    using Slot = detail::Slot;

    struct alignas(64) CallCount {
        std::uint64_t value = 0;
    };

    STRATA_DECL static int checked_size(int replicas);
    STRATA_DECL void check_rank(int rank, const SyncPoint& at) const;

    static constexpr int steps_of(Algorithm a, int n) noexcept {
        return a == Algorithm::Direct ? 1 : a == Algorithm::Ring ? 2 * n - 3 : 2 * (n - 1);
    }

    template <Reducible T>
    void all_reduce_impl(int rank, std::span<T> data, ReduceOp op, Algorithm algorithm, std::int64_t bucket);

    // What a rank publishes for an all-reduce call.
    template <Reducible T>
    static Slot all_reduce_slot(std::span<T> data, ReduceOp op, Algorithm alg, std::int64_t bucket) noexcept {
        Slot mine;
        mine.data = data.data();
        mine.length = data.size();
        mine.bucket = bucket;
        mine.kind = Slot::Kind::AllReduce;
        mine.type = detail::type_of<T>;
        mine.op = op;
        mine.algorithm = alg;
        return mine;
    }

    // Reduce-scatter inside the process, all-reduce of each slice across processes (on the
    // slice owner's lane), all-gather inside. Every element is summed in a fixed order (its
    // owner's local order, then the processes in rank order), so all replicas of all processes
    // get the same bits, run after run.
    template <Reducible T>
    void hierarchical_all_reduce(int rank, std::span<T> data, ReduceOp op, std::int64_t bucket);

    // Publishes this rank's arguments, meets the others, and checks that all agree.
    // The slots are double-buffered by call parity: a rank may publish call k+1 while a
    // slower rank still validates call k, but not call k+2, which needs that rank's arrival
    // at call k+1. Returns the N slots of this call, indexed by rank.
    STRATA_DECL const Slot* enter(int rank, const Slot& args, const SyncPoint& at);
    STRATA_DECL static const char* kind_name(Slot::Kind k) noexcept;
    // Every rank runs this on the same slots and so throws the same error, or none.
    STRATA_DECL void validate(const Slot* s, const SyncPoint& at) const;

    int n_;
    Rendezvous rv_;
    std::vector<Slot> slots_;       // [parity][rank]
    std::vector<CallCount> calls_;  // per rank, written only by that rank's thread
    OuterStage outer_{};
};

// ---- the member templates, for float and double compiled once in the compiled part ----

template <Reducible T>
void ReplicaGroup::broadcast(int rank, std::span<T> data, int root) {
    const SyncPoint at{"broadcast", {}, 0, 1};
    check_rank(rank, at);
    if (n_ == 1) {
        STRATA_CHECK(root == 0, DistributedError, at.str(), ": root ", root,
                     " is outside [0, 1)");
        rv_.throw_if_aborted(at);
        return;
    }
    detail::Slot mine;
    mine.data = data.data();
    mine.length = data.size();
    mine.root = root;
    mine.kind = detail::Slot::Kind::Broadcast;
    mine.type = detail::type_of<T>;
    const detail::Slot* all = enter(rank, mine, at);
    if (rank != root)
        detail::copy(data.data(), static_cast<const T*>(all[root].data), data.size());
    rv_.arrive_and_wait(rank, SyncPoint{"broadcast", {}, 1, 1});
}

template <Reducible T>
void ReplicaGroup::all_reduce_impl(int rank, std::span<T> data, ReduceOp op, Algorithm algorithm, std::int64_t bucket) {
    if (outer_) {
        hierarchical_all_reduce(rank, data, op, bucket);
        return;
    }
    const Algorithm alg = resolve(algorithm);
    const SyncPoint at{"all_reduce", to_string(alg), 0, steps_of(alg, n_), bucket};
    check_rank(rank, at);
    if (n_ == 1) {
        rv_.throw_if_aborted(at);
        return;
    }
    const Slot* all = enter(rank, all_reduce_slot(data, op, alg, bucket), at);
    const Exchange<T> ex(all, n_, rank, data.size(), rv_, at);
    switch (alg) {
        case Algorithm::Ring: ring_all_reduce(ex, op); break;
        case Algorithm::NaiveRing: naive_ring_all_reduce(ex, op); break;
        default: direct_all_reduce(ex, op); break;
    }
}

template <Reducible T>
void ReplicaGroup::hierarchical_all_reduce(int rank, std::span<T> data, ReduceOp op, std::int64_t bucket) {
    const SyncPoint at{"all_reduce", "hierarchical", 0, 2, bucket};
    check_rank(rank, at);
    const T total = static_cast<T>(n_) * static_cast<T>(outer_.processes);
    auto across = [&](std::span<T> part) {
        if constexpr (std::same_as<T, float>) outer_.sum_float(outer_.self, rank, part, bucket);
        else outer_.sum_double(outer_.self, rank, part, bucket);
        if (op == ReduceOp::Mean)
            for (auto& v : part) v /= total;
    };
    if (n_ == 1) {
        rv_.throw_if_aborted(at);
        across(data);
        return;
    }
    const Slot* all = enter(rank, all_reduce_slot(data, op, Algorithm::Direct, bucket), at);
    const Exchange<T> ex(all, n_, rank, data.size(), rv_, at);
    direct_reduce_slice(ex);
    across(std::span<T>(data.data() + ex.chunk_begin(rank), ex.chunk_size(rank)));
    ex.step(1, 2);
    direct_gather_slices(ex);
    ex.step(2, 2);
}

#if STRATA_INSTANCES
STRATA_TEMPLATE void ReplicaGroup::broadcast<float>(int, std::span<float>, int);
STRATA_TEMPLATE void ReplicaGroup::broadcast<double>(int, std::span<double>, int);
STRATA_TEMPLATE void ReplicaGroup::all_reduce_impl<float>(int, std::span<float>, ReduceOp, Algorithm, std::int64_t);
STRATA_TEMPLATE void ReplicaGroup::all_reduce_impl<double>(int, std::span<double>, ReduceOp, Algorithm, std::int64_t);
STRATA_TEMPLATE void ReplicaGroup::hierarchical_all_reduce<float>(int, std::span<float>, ReduceOp, std::int64_t);
STRATA_TEMPLATE void ReplicaGroup::hierarchical_all_reduce<double>(int, std::span<double>, ReduceOp, std::int64_t);
#endif

}  // namespace strata::distribute::collective

#if STRATA_DEFINITIONS
#include "strata/distribute/collective/impl/all_reduce.ipp"
#endif
