#pragma once
/// \file strata/distribute/collective/impl/all_reduce.ipp
/// The non-template definitions behind strata/distribute/collective/all_reduce.hpp (ReplicaGroup):
/// included by it in the header-only mode, compiled once in src/strata.cpp under
/// STRATA_SEPARATE_COMPILATION (with the member templates for float and double).

#include "strata/distribute/collective/all_reduce.hpp"

namespace strata::distribute::collective {

STRATA_DECL ReplicaGroup::ReplicaGroup(int replicas, GroupOptions options)
    : n_(checked_size(replicas)),
      rv_(n_, options.timeout),
      slots_(2 * static_cast<std::size_t>(n_)),
      calls_(static_cast<std::size_t>(n_)) {}

STRATA_DECL void ReplicaGroup::barrier(int rank) {
    const SyncPoint at{"barrier"};
    check_rank(rank, at);
    if (n_ == 1) {
        rv_.throw_if_aborted(at);
        return;
    }
    detail::Slot mine;
    mine.kind = detail::Slot::Kind::Barrier;
    enter(rank, mine, at);
}

STRATA_DECL void ReplicaGroup::reset() {
    rv_.reset();
    for (auto& c : calls_) c.value = 0;
}

STRATA_DECL int ReplicaGroup::checked_size(int replicas) {
    STRATA_CHECK(replicas >= 1, ValueError, "ReplicaGroup: replicas must be >= 1, got ",
                 replicas);
    return replicas;
}

STRATA_DECL void ReplicaGroup::check_rank(int rank, const SyncPoint& at) const {
    if (rank < 0 || rank >= n_)
        throw_error<ValueError>(at.str(), ": rank ", rank, " is outside [0, ", n_, ")");
}

STRATA_DECL const ReplicaGroup::Slot* ReplicaGroup::enter(int rank, const Slot& args, const SyncPoint& at) {
    Slot mine = args;
    mine.call = calls_[static_cast<std::size_t>(rank)].value++;
    Slot* set = slots_.data() + static_cast<std::size_t>(mine.call & 1U) *
                                    static_cast<std::size_t>(n_);
    set[rank] = mine;
    rv_.arrive_and_wait(rank, at);
    validate(set, at);
    return set;
}

STRATA_DECL const char* ReplicaGroup::kind_name(Slot::Kind k) noexcept {
    switch (k) {
        case Slot::Kind::AllReduce: return "all_reduce";
        case Slot::Kind::Broadcast: return "broadcast";
        case Slot::Kind::Barrier: return "barrier";
    }
    return "?";
}

STRATA_DECL void ReplicaGroup::validate(const Slot* s, const SyncPoint& at) const {
    const Slot& a = s[0];
    for (int q = 1; q < n_; ++q) {
        const Slot& b = s[q];
        if (b.call != a.call || b.kind != a.kind)
            throw_error<DistributedError>(
                at.str(), ": replica ", q, " is at its collective call #", b.call, " (",
                kind_name(b.kind), ") but replica 0 at #", a.call, " (", kind_name(a.kind),
                "); every replica must call the same collectives in the same order");
        if (b.kind == Slot::Kind::Barrier) continue;
        if (b.type != a.type)
            throw_error<DistributedError>(
                at.str(), ": replica ", q, " passed ",
                b.type == Slot::Type::Float ? "float" : "double", " but replica 0 passed ",
                a.type == Slot::Type::Float ? "float" : "double",
                "; every replica must pass the same element type");
        if (b.length != a.length)
            throw_error<ShapeError>(at.str(), ": replica ", q, " passed ", b.length,
                                    " elements but replica 0 passed ", a.length,
                                    "; every replica must pass the same length");
        if (b.bucket != a.bucket)
            throw_error<DistributedError>(
                at.str(), ": replica ", q, " submitted bucket ", b.bucket,
                " but replica 0 bucket ", a.bucket,
                "; every replica must submit its buckets in the same order");
        if (b.kind == Slot::Kind::AllReduce && (b.op != a.op || b.algorithm != a.algorithm))
            throw_error<DistributedError>(
                at.str(), ": replica ", q, " asked for ", to_string(b.op), " with ",
                to_string(b.algorithm), " but replica 0 for ", to_string(a.op), " with ",
                to_string(a.algorithm), "; every replica must pass the same op and algorithm");
        if (b.kind == Slot::Kind::Broadcast && b.root != a.root)
            throw_error<DistributedError>(at.str(), ": replica ", q, " passed root ", b.root,
                                          " but replica 0 root ", a.root,
                                          "; every replica must pass the same root");
    }
    if (a.kind == Slot::Kind::Barrier) return;
    if (a.kind == Slot::Kind::Broadcast && (a.root < 0 || a.root >= n_))
        throw_error<DistributedError>(at.str(), ": root ", a.root, " is outside [0, ", n_,
                                      ")");
    if (a.length == 0) return;
    const std::size_t bytes = a.length * (a.type == Slot::Type::Float ? 4 : 8);
    for (int p = 0; p < n_; ++p)
        for (int q = p + 1; q < n_; ++q) {
            const auto bp = reinterpret_cast<std::uintptr_t>(s[p].data);
            const auto bq = reinterpret_cast<std::uintptr_t>(s[q].data);
            if (bp < bq + bytes && bq < bp + bytes)
                throw_error<DistributedError>(
                    at.str(), ": replicas ", p, " and ", q,
                    " passed overlapping buffers; each replica needs its own buffer");
        }
}

}  // namespace strata::distribute::collective
