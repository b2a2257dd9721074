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

#include <strata/config.hpp>
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
    STRATA_MPI_DECL Mailbox(MPI_Comm comm, std::chrono::milliseconds timeout, std::function<std::string(int)> name = {});
    Mailbox(const Mailbox&) = delete;
    Mailbox& operator=(const Mailbox&) = delete;

    /// Completes the sends still in flight (within the timeout); a mailbox whose sends cannot
    /// complete (the peer is gone) leaks their buffers and its communicator rather than hang.
    STRATA_MPI_DECL ~Mailbox();

    [[nodiscard]] int rank() const noexcept { return rank_; }
    [[nodiscard]] int size() const noexcept { return size_; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    [[nodiscard]] std::string name(int rank) const { return name_(rank); }

    /// Sends `payload` to rank `to` as a message of `kind` for `step`; returns at once.
    STRATA_MPI_DECL void send(int to, std::uint32_t kind, std::uint64_t step, std::span<const std::byte> payload = {});
    template <class T>
    void send(int to, std::uint32_t kind, std::uint64_t step, std::span<const T> values) {
        send(to, kind, step, std::as_bytes(values));
    }

    /// The next message from `from` (MPI_ANY_SOURCE: from anyone), waiting at most `timeout`
    /// (0: the mailbox's); DistributedError `<what>: server 1 (rank 2) did not answer within
    /// 3000 ms` otherwise.
    STRATA_MPI_DECL Message receive(int from, std::string_view what, std::chrono::milliseconds timeout = {});

    /// A message from `from` if one has arrived (never waits).
    STRATA_MPI_DECL std::optional<Message> try_receive(int from);

    /// Sends still in flight (their peer has not taken them yet, for large ones).
    [[nodiscard]] STRATA_MPI_DECL std::size_t sends_in_flight();

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

    STRATA_MPI_DECL bool flush_sends();
    // Drops completed sends; true when none is left.
    STRATA_MPI_DECL bool flush_sends_locked();

    std::chrono::milliseconds timeout_;
    std::function<std::string(int)> name_;
    int provided_ = MPI_THREAD_SINGLE;
    int rank_ = 0, size_ = 1;
    MPI_Comm comm_ = MPI_COMM_NULL;
    std::mutex mutex_;        // the sends' list; MPI itself is thread-safe at MPI_THREAD_MULTIPLE
    std::list<Pending> sends_;  // a list: the buffers must not move while MPI reads them
};

}  // namespace strata::distribute::collective

#if STRATA_MPI_DEFINITIONS
#include "strata/distribute/collective/impl/mailbox.ipp"
#endif
