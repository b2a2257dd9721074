#pragma once
/// \file strata/distribute/collective/mailbox.hpp
/// Point-to-point messages between the ranks of an MPI communicator, where every wait has a
/// deadline and a rank that does not answer is named: the transport a parameter server across
/// processes needs (a pull's reply, a push into a server's inbox, an acknowledgement), where
/// ranks talk in pairs rather than all together, so the collectives of process_group.hpp do not
/// fit. Needs <mpi.h> (MPI-3).
///
/// A message is a kind (what it is), a step (which mini-batch or update it belongs to) and a
/// payload of bytes. Sends never block: each is an MPI_Isend of a buffer the mailbox owns until
/// it completes. Receives poll MPI_Improbe against a RunningDeadline (a job suspended as a whole
/// does not time out), so a peer that died (kill -9) or stalls (SIGSTOP) is named at the
/// deadline — `ParameterServer: pull reply: server 1 (rank 2) did not answer within 3000 ms` —
/// instead of hanging the caller. Messages between two ranks arrive in the order they were sent
/// (MPI's non-overtaking rule), which is what lets a reader match replies to requests.
///
/// \code
/// strata::distribute::collective::Mailbox box(MPI_COMM_WORLD, std::chrono::seconds(10));
/// if (rank == 1) box.send(0, /*kind=*/7, /*step=*/42, std::span<const float>(grads));
/// if (rank == 0) { auto m = box.receive(1, "push"); auto g = m.as<float>(); }
/// \endcode
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <strata/core/error.hpp>
#include <strata/distribute/collective/process_group.hpp>
#include <strata/distribute/rendezvous.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace strata::distribute::collective {

/// A message as received: who sent it, what it is, the step it belongs to, its payload.
struct Message {
    int source = -1;
    std::uint32_t kind = 0;
    std::uint64_t step = 0;
    std::vector<std::byte> payload{};

    /// The payload as `T`s (its size must be a multiple of sizeof(T): ShapeError otherwise).
    template <class T>
    [[nodiscard]] std::vector<T> as() const {
        STRATA_CHECK(payload.size() % sizeof(T) == 0, ShapeError, "Message: a payload of ", payload.size(),
                     " bytes is not a whole number of ", sizeof(T), "-byte elements");
        std::vector<T> out(payload.size() / sizeof(T));
        if (!out.empty()) std::memcpy(out.data(), payload.data(), payload.size());
        return out;
    }
};

/// Point-to-point messages with deadlines (see the file comment).
///
/// Requires: every rank of `comm` constructs it (it duplicates the communicator); a receive is
/// matched only by messages sent through a Mailbox on the same communicator. Thread-safe when
/// MPI provides MPI_THREAD_MULTIPLE (strata asks for it); otherwise calls are serialised here.
class Mailbox {
public:
    /// `timeout`: the longest any receive waits. `name(rank)` says how errors name a rank
    /// (default "rank 2 of 4").
    Mailbox(MPI_Comm comm, std::chrono::milliseconds timeout, std::function<std::string(int)> name = {})
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
    Mailbox(const Mailbox&) = delete;
    Mailbox& operator=(const Mailbox&) = delete;

    /// Completes the sends still in flight (within the timeout); a mailbox whose sends cannot
    /// complete (the peer is gone) leaks their buffers and its communicator rather than hang.
    ~Mailbox() {
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

    [[nodiscard]] int rank() const noexcept { return rank_; }
    [[nodiscard]] int size() const noexcept { return size_; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    [[nodiscard]] std::string name(int rank) const { return name_(rank); }

    /// Sends `payload` to rank `to` as a message of `kind` for `step`; returns at once.
    void send(int to, std::uint32_t kind, std::uint64_t step, std::span<const std::byte> payload = {}) {
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
    template <class T>
    void send(int to, std::uint32_t kind, std::uint64_t step, std::span<const T> values) {
        send(to, kind, step, std::as_bytes(values));
    }

    /// The next message from `from` (MPI_ANY_SOURCE: from anyone), waiting at most `timeout`
    /// (0: the mailbox's); DistributedError `<what>: server 1 (rank 2) did not answer within
    /// 3000 ms` otherwise.
    Message receive(int from, std::string_view what, std::chrono::milliseconds timeout = {}) {
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

    /// A message from `from` if one has arrived (never waits).
    std::optional<Message> try_receive(int from) {
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

    /// Sends still in flight (their peer has not taken them yet, for large ones).
    [[nodiscard]] std::size_t sends_in_flight() {
        std::lock_guard lock(mutex_);
        flush_sends_locked();
        return sends_.size();
    }

private:
    struct Header {
        std::uint32_t kind;
        std::uint32_t reserved;
        std::uint64_t step;
    };
    static constexpr std::size_t header_bytes = sizeof(Header);
    static constexpr int tag = 0x5378;
    static constexpr auto poll = std::chrono::milliseconds(2);
    struct Pending {
        std::vector<std::byte> bytes;
        MPI_Request request = MPI_REQUEST_NULL;
    };

    bool flush_sends() {
        std::lock_guard lock(mutex_);
        return flush_sends_locked();
    }
    // Drops completed sends; true when none is left.
    bool flush_sends_locked() {
        for (auto it = sends_.begin(); it != sends_.end();) {
            int done = 0;
            MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
            it = done ? sends_.erase(it) : std::next(it);
        }
        return sends_.empty();
    }

    std::chrono::milliseconds timeout_;
    std::function<std::string(int)> name_;
    int provided_ = MPI_THREAD_SINGLE;
    int rank_ = 0, size_ = 1;
    MPI_Comm comm_ = MPI_COMM_NULL;
    std::mutex mutex_;        // the sends' list; MPI itself is thread-safe at MPI_THREAD_MULTIPLE
    std::list<Pending> sends_;  // a list: the buffers must not move while MPI reads them
};

}  // namespace strata::distribute::collective
