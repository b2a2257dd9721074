#pragma once
/// \file strata/distribute/collective/impl/mailbox.ipp
/// The definitions behind strata/distribute/collective/mailbox.hpp (Mailbox): included by it in
/// the header-only mode, compiled once in src/strata_mpi.cpp under STRATA_SEPARATE_COMPILATION_MPI.

#include "strata/distribute/collective/mailbox.hpp"

namespace strata::distribute::collective {

STRATA_MPI_DECL Mailbox::Mailbox(MPI_Comm comm, std::chrono::milliseconds timeout, std::function<std::string(int)> name)
    : timeout_(timeout), name_(std::move(name)) {
    STRATA_CHECK(timeout.count() > 0, ValueError, "Mailbox: the timeout must be > 0 ms, got ", timeout.count(), " ms");
    provided_ = mpi::ensure_initialized();
    MPI_Comm_size(comm, &size_);
    MPI_Comm_rank(comm, &rank_);
    if (!name_) name_ = [n = size_](int r) { return "rank " + std::to_string(r) + " of " + std::to_string(n); };
    MPI_Request req;
    MPI_Comm_idup(comm, &comm_, &req);
    RunningDeadline d(timeout_, poll);
    for (int done = 0;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) break;
        if (d.expired()) {
            mpi::job_failed() = true;
            throw DistributedError("Mailbox: set-up: some rank did not arrive within " + std::to_string(timeout_.count()) + " ms");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    // A peer that died must not take this process with it through MPI's default handler:
    // its absence is named at the receiver's deadline instead.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

STRATA_MPI_DECL Mailbox::~Mailbox() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    RunningDeadline d(timeout_, poll);
    while (!flush_sends()) {
        if (d.expired()) {
            for (auto& s : sends_) (void)new std::vector<std::byte>(std::move(s.bytes));  // MPI may still read them
            sends_.clear();
            return;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    MPI_Comm_free(&comm_);
}

STRATA_MPI_DECL void Mailbox::send(int to, std::uint32_t kind, std::uint64_t step, std::span<const std::byte> payload) {
    STRATA_CHECK(to >= 0 && to < size_, ValueError, "Mailbox::send: rank ", to, " is outside [0, ", size_, ")");
    Pending p;
    const Header h{kind, 0, step};
    const auto* head = reinterpret_cast<const std::byte*>(&h);
    p.bytes.reserve(header_bytes + payload.size());
    p.bytes.insert(p.bytes.end(), head, head + header_bytes);
    p.bytes.insert(p.bytes.end(), payload.begin(), payload.end());
    STRATA_CHECK(p.bytes.size() <= std::size_t(INT32_MAX), ValueError, "Mailbox::send: ", payload.size(),
                 " bytes do not fit in one MPI message");
    std::lock_guard lock(mutex_);
    sends_.push_back(std::move(p));
    auto& back = sends_.back();
    MPI_Isend(back.bytes.data(), int(back.bytes.size()), MPI_BYTE, to, tag, comm_, &back.request);
    flush_sends_locked();
}

STRATA_MPI_DECL Message Mailbox::receive(int from, std::string_view what, std::chrono::milliseconds timeout) {
    if (timeout.count() <= 0) timeout = timeout_;
    RunningDeadline d(timeout, poll);
    for (int spins = 0;; ++spins) {
        if (auto m = try_receive(from)) return std::move(*m);
        if (d.expired())
            throw DistributedError(std::string(what) + ": " +
                                   (from == MPI_ANY_SOURCE ? std::string("no rank") : name_(from)) +
                                   " did not answer within " + std::to_string(timeout.count()) + " ms");
        if (spins > 256) std::this_thread::sleep_for(std::chrono::microseconds(spins > 4096 ? 500 : 50));
    }
}

STRATA_MPI_DECL std::optional<Message> Mailbox::try_receive(int from) {
    std::unique_lock lock(mutex_);
    flush_sends_locked();
    int flag = 0;
    MPI_Message handle;
    MPI_Status st;
    MPI_Improbe(from, tag, comm_, &flag, &handle, &st);
    if (!flag) return std::nullopt;
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    auto bytes = std::make_unique<std::vector<std::byte>>(std::size_t(n > 0 ? n : 0));
    // A large message arrives in parts: a sender stopped or killed part-way must not block
    // this receive forever (MPI_Mrecv would), so it is polled against the deadline too.
    MPI_Request req;
    MPI_Imrecv(bytes->data(), n, MPI_BYTE, &handle, &req);
    RunningDeadline d(timeout_, poll);
    for (int done = 0, spins = 0;; ++spins) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) break;
        if (d.expired()) {
            (void)bytes.release();  // MPI may still write into it
            throw DistributedError("Mailbox: " + name_(st.MPI_SOURCE) + " stopped part-way through a message of " +
                                   std::to_string(n) + " bytes (nothing more came within " +
                                   std::to_string(timeout_.count()) + " ms)");
        }
        lock.unlock();
        if (spins > 256) std::this_thread::sleep_for(std::chrono::microseconds(50));
        else std::this_thread::yield();
        lock.lock();
    }
    STRATA_CHECK(bytes->size() >= header_bytes, DistributedError, "Mailbox: ", name_(st.MPI_SOURCE), " sent ", bytes->size(),
                 " bytes, less than a message header (is every rank the same program?)");
    Header h;
    std::memcpy(&h, bytes->data(), header_bytes);
    Message m{st.MPI_SOURCE, h.kind, h.step, {}};
    m.payload.assign(bytes->begin() + std::ptrdiff_t(header_bytes), bytes->end());
    return m;
}

STRATA_MPI_DECL std::size_t Mailbox::sends_in_flight() {
    std::lock_guard lock(mutex_);
    flush_sends_locked();
    return sends_.size();
}

STRATA_MPI_DECL bool Mailbox::flush_sends() {
    std::lock_guard lock(mutex_);
    return flush_sends_locked();
}

STRATA_MPI_DECL bool Mailbox::flush_sends_locked() {
    for (auto it = sends_.begin(); it != sends_.end();) {
        int done = 0;
        MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
        it = done ? sends_.erase(it) : std::next(it);
    }
    return sends_.empty();
}

}  // namespace strata::distribute::collective
