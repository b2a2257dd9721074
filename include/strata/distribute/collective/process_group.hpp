#pragma once
/// \file strata/distribute/collective/process_group.hpp
/// Collectives among the processes of an MPI job (one rank per process): all-reduce, all-gather,
/// broadcast and barrier, where every wait has a deadline and a rank that does not arrive is named. It is
/// the cross-process stage of MultiWorkerMirrored's hierarchical all-reduce (see
/// strata/distribute/multi_worker_mirrored.hpp) and needs <mpi.h> (OpenMPI or MPICH, MPI-3).
///
/// Three transports:
/// - SharedMemory (Auto's choice when every rank is on one host): an MPI-3 shared window
///   (MPI_Win_allocate_shared) holds, per rank, an arrival counter per lane and two staging
///   buffers per lane. A collective is a direct reduce-scatter + all-gather through them,
///   synchronised by the counters, which is what lets a waiting rank see exactly which ranks
///   are late (MPI itself has no collective with a timeout). No MPI call is made per step.
/// - Mpi (Auto's choice across hosts, or forced): on a communicator per lane, polled against
///   the deadline, an all-reduce of at least ProcessGroupOptions::ring_min_bytes is strata's
///   own ring (reduce-scatter then all-gather, point to point between neighbours: each rank
///   sends and receives 2 (P - 1) / P of the buffer, both ways at once, each element summed
///   once), smaller ones MPI_Iallreduce; all-gathers MPI_Iallgatherv, broadcasts MPI_Ibcast. Before each collective the
///   ranks report their arrival to rank 0, which names whoever is missing.
/// - Hierarchical (Auto's choice when several hosts hold several ranks each): the ranks are
///   grouped by host; inside a host a shared-memory group all-reduces, the host's leader (its
///   lowest rank) all-reduces the host's sum with the other leaders over MPI, and broadcasts the
///   result back through shared memory (the two-level all-reduce of Horovod's hierarchical mode,
///   with one leader per host). The cross-host stage's bytes and time are counted
///   (cross_host_stats()). On one machine a layout of several hosts is declared with
///   ProcessGroupOptions::fake_hosts or the environment variable STRATA_FAKE_HOSTS=H: the ranks
///   are split into H hosts of consecutive ranks (4 ranks, H = 2: {0, 1} and {2, 3}).
///
/// Host layout: the hosts are told apart by MPI_Get_processor_name, or STRATA_HOST_NAME where a
/// process sets it. Ranks that name one host must share memory (MPI_COMM_TYPE_SHARED) wherever
/// a shared-memory window would be made, and a job may say the layout it was launched for
/// (ProcessGroupOptions::expect_hosts, STRATA_EXPECT_HOSTS=HxP): either is refused on every
/// rank, naming the layout found (host_layout()), before any collective.
///
/// Lanes: up to `lanes` threads of a process may call collectives at the same time, each on its
/// own lane (MultiWorkerMirrored gives each local replica a lane, so that the R slices of a
/// gradient bucket cross processes in parallel). Calls on one lane pair up in program order
/// across ranks, as in MPI.
///
/// Joining: the constructor first exchanges every rank's settings (lanes, transport, timeout,
/// chunk size, and whatever ProcessGroupOptions::settings adds) point to point on the caller's
/// communicator, tags 0x5374 and 0x5375 (a program must not use them on it), polled against
/// the start-up deadline (ProcessGroupOptions::startup_timeout, by default max(timeout, 30 s):
/// a rank still starting on a loaded machine is late, not lost); ranks that are not there are
/// named, settings that differ are refused on every rank, and only then are the collective MPI
/// calls of the set-up made. agree() checks more settings later (MultiWorkerMirrored's model
/// and optimizer), under the same start-up deadline.
///
/// Faults: a wait that exceeds the timeout throws DistributedError
/// `all_reduce (lane 0): rank 2 of 3 did not arrive within 10000 ms` on every rank that waits,
/// and marks the group failed, so the other ranks stop at once with the same cause instead of
/// timing out one after another. Before the deadline a stall warning names the late ranks on
/// stderr once per wait (Horovod's stall inspector does the same). A rank that dies is
/// normally ended with the whole job by the launcher (mpirun, srun); if the launcher lets the
/// job live, the others name it at their deadline. A failed group stays failed: a job whose
/// rank vanished must be restarted (BackupAndRestore makes that cheap).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <strata/config.hpp>
#include <strata/core/error.hpp>
#include <strata/distribute/collective/common.hpp>
#include <strata/distribute/rendezvous.hpp>
#include <strata/distribute/settings.hpp>
#include <strata/distribute/stop_agreement.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace strata::distribute::collective {

/// How a ProcessGroup moves data between processes.
enum class Transport { Auto, SharedMemory, Mpi, Hierarchical };

[[nodiscard]] constexpr std::string_view to_string(Transport t) noexcept {
    switch (t) {
        case Transport::Auto: return "auto";
        case Transport::SharedMemory: return "shared_memory";
        case Transport::Mpi: return "mpi";
        case Transport::Hierarchical: return "hierarchical";
    }
    return "unknown";
}

/// Options of a ProcessGroup.
struct ProcessGroupOptions {
    /// A rank waits at most this long for the others at any point of a collective.
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};
    /// After this long a waiting rank prints which ranks are late (once per wait); 0 = half the
    /// timeout; negative = never.
    std::chrono::milliseconds stall_warning{0};
    /// Auto: SharedMemory when every rank is on one host, Mpi otherwise.
    Transport transport = Transport::Auto;
    /// Bytes each rank stages per lane and step of the shared-memory transport (two such
    /// buffers per lane, so the next chunk is staged while others still read the last).
    /// 512 KiB measured best here (benchmarks/bench_mpi_allreduce --chunk-kb, docs/benchmarks.md):
    /// a chunk and its partner stay in the cores' L2 between staging and reading.
    std::size_t chunk_bytes = std::size_t(512) << 10;
    /// More settings every rank must share (e.g. a program's flags), checked with the group's
    /// own when the ranks join (see ProcessGroup's constructor and agree()).
    std::vector<std::pair<std::string, std::string>> settings{};
    /// The host layout: 0 = the real hosts (from MPI_Get_processor_name); H >= 1 = pretend the
    /// ranks run on H hosts of size/H consecutive ranks each (testing the hierarchical transport
    /// on one machine); -1 = read STRATA_FAKE_HOSTS (unset or empty: the real hosts).
    int fake_hosts = -1;
    /// (Last, so that positional initialisers written before it keep their meaning.) How long a rank waits for the others while the group is set up: the join (the settings'
    /// exchange and the set-up's MPI calls) and agree(). Ranks are then still starting (MPI
    /// lets each one leave MPI_Init on its own; it loads its data and builds its model first),
    /// and on a loaded machine a slow start is not a lost rank: the step deadline `timeout`
    /// would name one that is only late (issue 41: "set-up (process group): rank 3 of 4 did
    /// not arrive within 2000 ms" before any fault). 0: max(timeout, 30 s). Collectives keep
    /// `timeout`: a rank that dies once training runs is named within it.
    std::chrono::milliseconds startup_timeout{0};
    /// The host layout the job was launched with, checked when the ranks join: "H" (H hosts)
    /// or "HxP" (H hosts of P ranks each), in decimal digits. A job whose layout differs (a
    /// hostfile that was not read, ranks mapped elsewhere) is refused on every rank with the
    /// layout found, before any training. Only a group over every rank of the job checks it.
    /// Empty: read STRATA_EXPECT_HOSTS (unset or empty: no expectation); "any": none, whatever
    /// the environment says. scripts/multihost sets it for the job it starts.
    std::string expect_hosts{};
    /// The MPI transport (and the hierarchical transport's stage between hosts) all-reduces a
    /// buffer of at least this many bytes with its own ring: reduce-scatter then all-gather
    /// between neighbouring ranks, point to point, each rank sending and receiving
    /// 2 (P - 1) / P of the buffer both ways at once. Smaller buffers, and all when it is
    /// SIZE_MAX, go to MPI_Iallreduce (fewer rounds). Open MPI 4.1 serves MPI_Iallreduce with
    /// algorithms that sent 2 buffers per rank, or one each way in turn, over a slow link
    /// (docs/benchmarks.md, "Across emulated hosts"). Every rank must use the same value.
    std::size_t ring_min_bytes = std::size_t(256) << 10;
};

/// What the cross-host stage of the hierarchical transport did on this rank (a host leader;
/// zero elsewhere): all-reduce calls, payload bytes each leader put into them, seconds spent.
struct CrossHostStats {
    std::int64_t calls = 0;
    std::int64_t bytes = 0;
    double seconds = 0;
};

namespace mpi {

/// Set when any ProcessGroup of this process failed: MPI_Finalize, which waits for every
/// rank, is then skipped at exit, and the launcher ends the job (it sees a process exit
/// without finalizing).
STRATA_MPI_DECL std::atomic<bool>& job_failed();

/// Throws DistributedError when a launcher started several processes (srun, mpiexec: see
/// launcher.hpp) but MPI sees this one alone: MPI was not initialised through the launcher's
/// process manager (srun without a PMI plug-in that this MPI speaks), so every process would
/// train as its own one-process job.
STRATA_MPI_DECL void check_launcher();

/// Initializes MPI (MPI_THREAD_MULTIPLE asked for) unless the program already did, and
/// finalizes it at exit if strata initialized it. Returns the thread level MPI provides.
/// Throws DistributedError when a launcher started several processes but MPI sees one
/// (check_launcher).
STRATA_MPI_DECL int ensure_initialized();

STRATA_MPI_DECL int world_rank();
STRATA_MPI_DECL int world_size();

/// The MPI_COMM_WORLD rank of each rank of `comm`: how messages name a rank of a group over part
/// of the job (the number mpirun and the other ranks use).
STRATA_MPI_DECL std::vector<int> world_ranks(MPI_Comm comm);

/// This process's index among the processes of `comm` on its host.
STRATA_MPI_DECL int local_rank(MPI_Comm comm = MPI_COMM_WORLD);

/// Processes of `comm` on this host (MPI_COMM_TYPE_SHARED).
STRATA_MPI_DECL int local_size(MPI_Comm comm = MPI_COMM_WORLD);

template <class T>
MPI_Datatype datatype() {
    if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
    else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
    else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
    else return MPI_BYTE;
}

}  // namespace mpi

/// A communicator over the ranks of an MPI communicator, with deadlines (see the file comment).
///
/// Requires: every rank constructs it collectively with the same lanes and options; on each
/// lane every rank makes the same sequence of calls with the same lengths, types and roots;
/// at most one thread per lane at a time.
/// Ensures: results are identical on every rank and reproducible run to run (each element of
/// an all-reduce is summed by one rank, in a fixed order, and copied to the others).
class ProcessGroup {
public:
    using clock = std::chrono::steady_clock;

    /// Joins the ranks of `comm`. First the ranks exchange their settings, point to point and
    /// polled against the timeout (nothing blocks before every rank is known to be here): the
    /// lanes, the transport asked for, the timeout, chunk_bytes, options.settings and the
    /// program's settings (distribute::set_job_settings, strata/distribute/settings.hpp). A rank
    /// that does not come is named (DistributedError `rank 1 of 2 did not arrive within 60000
    /// ms`); settings that differ are a ValueError on every rank naming each one and which rank
    /// has what (`transport: rank 0 has mpi, rank 1 has shared_memory`). Only then are the
    /// group's communicators and window made (MPI_Comm_idup polled; MPI_Win_allocate_shared,
    /// which has no non-blocking form, once every rank is known to have agreed).
    STRATA_MPI_DECL ProcessGroup(MPI_Comm comm, int lanes, ProcessGroupOptions options = {});

    ProcessGroup(const ProcessGroup&) = delete;
    ProcessGroup& operator=(const ProcessGroup&) = delete;

    /// Frees the window and communicators, which MPI does collectively: only after a closing
    /// barrier with the usual deadline shows that every rank is here too. When a rank is
    /// missing (or the group failed, or the job lost a rank: mpi::job_failed()) nothing is
    /// freed: a collective free would hang, and the barrier would wait a timeout for nobody.
    STRATA_MPI_DECL ~ProcessGroup();

    [[nodiscard]] int rank() const noexcept { return rank_; }
    [[nodiscard]] int size() const noexcept { return size_; }
    [[nodiscard]] int lanes() const noexcept { return lanes_; }
    [[nodiscard]] Transport transport() const noexcept { return transport_; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return options_.timeout; }
    /// The set-up's deadline (ProcessGroupOptions::startup_timeout, resolved).
    [[nodiscard]] std::chrono::milliseconds startup_timeout() const noexcept { return options_.startup_timeout; }
    [[nodiscard]] MPI_Comm communicator() const noexcept { return comm_; }
    /// True once a collective of this group timed out or a rank called abort().
    [[nodiscard]] bool failed() const noexcept { return failed_; }
    /// This process's index among the ranks on its host, and their number (from the host
    /// names the ranks exchanged when they joined).
    [[nodiscard]] int local_rank() const noexcept { return local_rank_; }
    [[nodiscard]] int local_size() const noexcept { return local_size_; }
    /// The host layout the transports use (the real one, or STRATA_FAKE_HOSTS's): the number of
    /// hosts, this rank's host (hosts numbered in the order of their lowest rank), and this
    /// rank's index among its host's ranks (0: the host's leader).
    [[nodiscard]] int num_hosts() const noexcept { return host_count(); }
    [[nodiscard]] int host_index() const noexcept { return host_of_.empty() ? 0 : host_of_[std::size_t(rank_)]; }
    [[nodiscard]] int host_rank() const noexcept { return host_local_.empty() ? 0 : host_local_[std::size_t(rank_)]; }
    /// Hierarchical transport: what this rank's cross-host stage did (zero on ranks that do not
    /// lead a host, and under the other transports). Read it while no collective runs.
    [[nodiscard]] STRATA_MPI_DECL CrossHostStats cross_host_stats() const;

    /// Checks that every rank passes the same `settings` (what = what they are, for the
    /// message), e.g. once at set-up: the ranks exchange them point to point, polled against
    /// the start-up deadline (ProcessGroupOptions::startup_timeout: a set-up step, where ranks
    /// may still be building their model). Throws, on every rank alike, ValueError `ProcessGroup: the ranks disagree on
    /// the optimizer: optimizer: rank 0 has Adam(...), rank 1 has SGD(...)` naming every
    /// setting that differs; DistributedError naming a rank that does not come (the group is
    /// then failed). Requires: every rank calls it at the same point, from one thread, never
    /// concurrently with another agree(); collectives on the lanes may run meanwhile.
    STRATA_MPI_DECL void agree(const Settings& settings, std::string_view what = "settings");
    /// One setting: agree({{name, value}}).
    STRATA_MPI_DECL void agree(std::string_view name, std::string_view value);

    /// Sums (or averages) `data` over the ranks, in place, on `lane`.
    /// Throws ShapeError (shared memory: on every rank) when the ranks' lengths differ,
    /// DistributedError on a timeout or after a peer's abort.
    template <Reducible T>
    void all_reduce(int lane, std::span<T> data, ReduceOp op = ReduceOp::Sum, SyncPoint at = {"all_reduce"});

    /// All-gathers `data` in place: rank q's part is the counts[q] elements that follow the
    /// parts of ranks 0 .. q − 1, which rank q holds on entry (the rest of its `data` is
    /// overwritten); on return every rank holds every part, bit for bit as its owner had it.
    /// Each rank receives the others' parts, (N − 1)/N of the buffer for even parts: half what an
    /// all-reduce of the buffer moves into it (the reduce-scatter's (N − 1)/N, then the same
    /// again). Shared memory and MPI (MPI_Iallgatherv) copy the parts. The hierarchical
    /// transport gathers in two levels: each host's ranks gather the host's parts (shared
    /// memory), its leader all-gathers the hosts' blocks with the other leaders (MPI: each
    /// receives the other hosts' parts only, (H − 1)/H of the buffer for even hosts) and
    /// broadcasts the whole buffer to its host; the ranks of a host need not be consecutive.
    /// Requires: counts has one value per rank, none negative, summing to data.size(), the same
    /// on every rank. Throws ValueError (this rank's counts), ShapeError on every rank when the
    /// ranks' lengths or counts differ (hierarchical: when hosts differ, on the leaders, and the
    /// group fails), DistributedError as all_reduce.
    template <Reducible T>
    void all_gather(int lane, std::span<T> data, std::span<const std::int64_t> counts, SyncPoint at = {"all_gather"});

    /// Sums `data` (int64 counters) over the ranks, in place.
    STRATA_MPI_DECL void all_reduce_counts(int lane, std::span<std::int64_t> data, SyncPoint at = {"all_reduce"});

    /// Copies rank `root`'s `data` to every rank.
    template <Reducible T>
    void broadcast(int lane, std::span<T> data, int root = 0, SyncPoint at = {"broadcast"});

    /// Waits until every rank called barrier() on `lane`.
    STRATA_MPI_DECL void barrier(int lane = 0, SyncPoint at = {"barrier"});

    /// Marks the group failed on every rank because of `message` (a local replica threw): the
    /// other ranks' waits end at once with DistributedError naming this rank. Never throws.
    STRATA_MPI_DECL void abort(std::string_view message) noexcept;

    /// STRATA_FAKE_HOSTS=H, the one parser of it (every strategy reads it through this): H
    /// written in decimal digits alone, 1 <= H <= 2^20, or 0 when unset or empty. Anything else
    /// (" 2", "2 ", "+2", "2x", "0") is a ValueError naming the value.
    STRATA_MPI_DECL static int fake_hosts_from_environment();

    /// The host layout in words, the same on every rank: "2 hosts: 'node01' ranks 0-1,
    /// 'node02' ranks 2-3" (hosts in the order of their lowest rank; STRATA_FAKE_HOSTS's
    /// layout is named so).
    [[nodiscard]] STRATA_MPI_DECL std::string host_layout() const;

private:
    void mark_failed() noexcept {
        failed_ = true;
        mpi::job_failed() = true;
    }

    // Tags of the point-to-point exchanges: join's on the caller's communicator (the group's
    // own does not exist yet), agree's on the group's communicator (which carries nothing else).
    static constexpr int join_tag = 0x5374;  // and join_tag + 1
    static constexpr int agree_tag = 0x5376;  // and agree_tag + 1

    // The settings every rank must share; those that differ are refused on every rank. Sets
    // local_rank_ and local_size_ from the host names.
    STRATA_MPI_DECL void join(MPI_Comm comm);

    // Every rank runs this with the same values (they agreed on them): the same error everywhere.
    STRATA_MPI_DECL void check_fake_hosts() const;
    STRATA_MPI_DECL int host_count() const;
    // The layout expected (ProcessGroupOptions::expect_hosts or STRATA_EXPECT_HOSTS) against
    // the one found: the same ValueError on every rank when they differ.
    STRATA_MPI_DECL void check_expected_hosts(std::string_view expected) const;
    // Ranks that name one host must share memory (MPI_COMM_TYPE_SHARED): two machines that
    // answer to one name would put a shared-memory window across machines. Collective on `comm`.
    STRATA_MPI_DECL void check_hosts_share_memory(MPI_Comm comm) const;

    // ---- hierarchical transport ------------------------------------------------------------------

    // A shared-memory group per host and, on each host's leader, an MPI group of the leaders.
    // MPI_Comm_split blocks, but every rank is known to be here and to agree (join).
    STRATA_MPI_DECL void open_hierarchy();

    // Runs a hierarchical collective's stages; a failure in any stage fails this group and
    // stops the host's other ranks at once (the other hosts' leaders at their deadline).
    template <class F>
    void hierarchical(const SyncPoint& at, F&& stages);
    // The leaders' stage between hosts. A ShapeError there (the hosts' leaders passed other
    // lengths: their hosts disagree) reaches only the leaders, whose ranks wait for them; so it
    // fails this group and stops the host's other ranks with the leader's message, where a
    // ShapeError inside a host (every rank of it sees one) leaves the group usable.
    template <class F>
    void between_hosts(F&& stage);

    template <Reducible T>
    void hier_all_reduce(int lane, std::span<T> data, ReduceOp op, const SyncPoint& at);

    // The two-level all-gather (see all_gather). The parts are packed host by host (a host's
    // ranks in rank order) into the lane's scratch buffer: each host's ranks all-gather their
    // host's block inside it, its leader all-gathers the blocks with the other leaders, unpacks
    // every part to its place and broadcasts the buffer to the host's ranks.
    template <Reducible T>
    void hier_all_gather(int lane, std::span<T> data, std::span<const std::int64_t> counts, const SyncPoint& at);

    // The root's host first (inside it), then its leader to the other leaders, then each other
    // host's leader inside its host.
    template <Reducible T>
    void hier_broadcast(int lane, std::span<T> data, int root, const SyncPoint& at);

    // The host's leader broadcasts what it brought back from the other hosts. Its ranks wait
    // for it longer than the timeout (3 times: the leaders' arrival check, their transfer and
    // a margin), so that a rank missing on another host is named by the leaders' stage and
    // reaches these ranks as their leader's abort, not as their own timeout naming the leader.
    template <Reducible T>
    void leader_broadcast(int lane, std::span<T> data, const SyncPoint& at);

    // A deadline of `timeout` for a loop that polls at least every millisecond.
    RunningDeadline fresh(std::chrono::milliseconds timeout) const { return RunningDeadline(timeout, poll_interval); }
    static constexpr auto poll_interval = std::chrono::milliseconds(2);

    // MPI_Comm_idup, polled against the timeout.
    STRATA_MPI_DECL MPI_Comm dup(MPI_Comm c, const SyncPoint& at);

    // Every rank's `mine`, on every rank, in rank order. Each rank sends it to rank 0 (tag
    // `tag`), which answers (tag + 1) with all of them once every rank came, or with the ranks
    // missing at its deadline (`wait`: the start-up deadline); a rank waits for the answer
    // until rank 0's deadline plus `wait`. Rank 0 warns at the stall warning and again once
    // the wait outlasts the step deadline (`timeout`), saying that it goes on waiting. Point to point and polled: nothing blocks. On failure `failed` runs, the
    // message naming the missing ranks is thrown, and the buffers of requests still in flight
    // are leaked (a send or receive may still touch them).
    template <class OnFailure>
    std::vector<std::string> exchange(MPI_Comm c, int tag, const std::string& mine, const SyncPoint& at,
                                      std::chrono::milliseconds wait, OnFailure failed);

    // ---- shared-memory transport --------------------------------------------------------------

    // Per rank, in its part of the window: a control block, then lanes × 2 staging buffers.
    struct alignas(64) Control {
        std::atomic<std::uint32_t> aborted{0};
        char message[252]{};
    };
    struct alignas(64) Counter {
        std::atomic<std::uint64_t> value{0};    // the last arrival number this rank published
        std::atomic<std::uint64_t> gave_up{0};  // the arrival number it timed out on, if any
    };
    // What a rank passed to a collective call, compared across ranks before any data moves:
    // through the shared window (Descriptor, validate) or in the MPI transport's arrival check.
    struct Call {
        std::uint64_t length = 0;
        std::uint32_t type = 0;         // 1: float, 2: double, 0: none (a barrier)
        std::int32_t root = -3;         // the root; −1: all-reduce; gather_root: all-gather; barrier_root
        std::uint64_t parts = 0;        // an all-gather's counts (parts_key), else 0
    };
    struct alignas(64) Descriptor {
        std::atomic<std::uint64_t> call{0};
        Call what;
    };
    static constexpr std::int32_t reduce_root = -1, gather_root = -2, barrier_root = -3;
    template <class T>
    static Call call_of(std::uint64_t length, std::int32_t root, std::uint64_t parts = 0) {
        return Call{length, std::is_same_v<T, float> ? 1u : 2u, root, parts};
    }
    // "all_gather of float", "broadcast of double from rank 2", "barrier".
    STRATA_MPI_DECL static std::string describe(const Call& c);
    // Rank q's call against rank 0's: nothing when they match; else the error every rank
    // throws, the same on each (another collective, element type or root: a DistributedError,
    // and the group has failed; another length or other parts: a ShapeError, the group goes on).
    STRATA_MPI_DECL void refuse_mismatch(int lane, const SyncPoint& at, int q, const Call& zero, const Call& other);
    // The counts of an all-gather in one word (FNV-1a over the values): ranks whose counts
    // differ publish different words.
    static std::uint64_t parts_key(std::span<const std::int64_t> counts) {
        std::uint64_t h = 1469598103934665603ull;
        for (const std::int64_t c : counts) {
            h ^= std::uint64_t(c);
            h *= 1099511628211ull;
        }
        return h;
    }
    struct Lane {
        std::uint64_t seq = 0;    // barriers passed on this lane
        std::uint64_t calls = 0;  // collective calls on this lane
        std::uint64_t chunks = 0; // chunks staged (their parity picks the staging buffer)
    };

    static constexpr std::size_t align_up(std::size_t n) { return (n + 63) / 64 * 64; }
    std::size_t control_bytes() const {
        return align_up(sizeof(Control) + std::size_t(lanes_) * (sizeof(Counter) + 2 * sizeof(Descriptor)));
    }

    STRATA_MPI_DECL void open_window();

    Control& control(int q) const { return *reinterpret_cast<Control*>(bases_[std::size_t(q)]); }
    Counter* counter_ptr(int q, int lane) const {
        return reinterpret_cast<Counter*>(bases_[std::size_t(q)] + sizeof(Control)) + lane;
    }
    Descriptor* descriptor_ptr(int q, int lane, int parity) const {
        return reinterpret_cast<Descriptor*>(bases_[std::size_t(q)] + sizeof(Control) + std::size_t(lanes_) * sizeof(Counter)) +
               2 * lane + parity;
    }
    template <class T>
    T* staging(int q, int lane, std::uint64_t chunk) const {
        return reinterpret_cast<T*>(bases_[std::size_t(q)] + control_bytes() +
                                    (std::size_t(lane) * 2 + std::size_t(chunk & 1)) * align_up(options_.chunk_bytes));
    }
    Lane& lane_state(int lane) { return lane_[std::size_t(lane)]; }

    // Publishes arrival number `seq` on `lane` and waits until every rank has published it,
    // at most `timeout` (0: the group's).
    STRATA_MPI_DECL void arrive_and_wait(int lane, std::uint64_t seq, const SyncPoint& at, std::chrono::milliseconds timeout = {});
    // Lets MPI move what this process has in flight (an MPI_Iprobe): called by the shared-memory
    // waits, which make no MPI call of their own (see arrive_and_wait).
    STRATA_MPI_DECL void progress_mpi();

    [[noreturn]] STRATA_MPI_DECL void peer_failed(int q, const SyncPoint& at, int lane);

    // "rank 2 of 3" / "ranks 1, 2 of 4": who has not reached arrival number `seq` on `lane`.
    STRATA_MPI_DECL std::string missing(int lane, std::uint64_t seq) const;
    STRATA_MPI_DECL std::string ranks_text(const std::vector<int>& ranks) const;
    // A stage of a hierarchical group names the ranks of the whole job.
    int name_of(int q) const { return names_.empty() ? q : names_[std::size_t(q)]; }
    int named_size() const { return names_.empty() ? size_ : named_size_; }
    STRATA_MPI_DECL std::string where(const SyncPoint& at, int lane) const;

    STRATA_MPI_DECL void throw_if_failed(const SyncPoint& at) const;
    STRATA_MPI_DECL void check_lane(int lane, const SyncPoint& at) const;

    // Publishes this call's arguments; after the first barrier every rank checks them all.
    STRATA_MPI_DECL void publish(int lane, const Call& call);
    STRATA_MPI_DECL void validate(int lane, const SyncPoint& at);

    template <Reducible T>
    void shm_all_reduce(int lane, std::span<T> data, ReduceOp op, const SyncPoint& at);

    // Rank q stages its part's elements of each chunk; every rank copies the others' out.
    // `call`: what the ranks compare (the hierarchical stages pass the whole job's counts).
    template <Reducible T>
    void shm_all_gather(int lane, std::span<T> data, std::span<const std::int64_t> counts, const SyncPoint& at, const Call& call);

    template <Reducible T>
    // `first_wait`: the deadline of the first arrival (0: the group's timeout); the hierarchical
    // transport's ranks wait longer there for their leader, which may spend up to its own
    // deadlines between hosts first.
    void shm_broadcast(int lane, std::span<T> data, int root, const SyncPoint& at, std::chrono::milliseconds first_wait = {});

    // ---- MPI transport ---------------------------------------------------------------------------

    // Polls `req` until it completes or the deadline passes (time the process was suspended
    // is not counted: RunningDeadline).
    // `shown`: the deadline's length for the message (0: the timeout).
    STRATA_MPI_DECL void wait_request(MPI_Request& req, RunningDeadline& deadline, const SyncPoint& at, int lane, const std::string& who,
                                      std::chrono::milliseconds shown = {});

    // Every rank reports to rank 0; rank 0 answers "go" when all arrived, or names the missing
    // ranks to those that did. Gives the MPI transport the same error messages as shared memory.
    // `call` (Call{} for a barrier) rides along, and rank 0 compares the ranks' calls as the
    // shared-memory transport's validate does: a rank that passes another length or other part
    // sizes gets a typed error on every rank before MPI moves any data.
    STRATA_MPI_DECL void arrival_check(int lane, const SyncPoint& at, const Call& call);

    // Polls a collective's data transfer, posted once every rank had arrived (arrival_check).
    // Past the timeout a rank stopped, died or became unreachable part-way through it: the
    // ranks still stuck in it tell each other so (silent_ranks), and the error names those not
    // heard from, as the arrival check names those that did not come.
    STRATA_MPI_DECL void wait_transfer(MPI_Request& req, int lane, const SyncPoint& at);
    // The same for several requests (a ring step's send and receive): all must complete.
    STRATA_MPI_DECL void wait_transfers(std::span<MPI_Request> reqs, int lane, const SyncPoint& at);
    // The MPI transport's ring all-reduce (ProcessGroupOptions::ring_min_bytes): reduce-scatter
    // then all-gather between neighbours, point to point; bytes of T.
    template <Reducible T>
    void ring_all_reduce(int lane, std::span<T> data, const SyncPoint& at);
    // After a transfer's timeout: sends "stuck at this collective" to every other rank on the
    // lane's control communicator and collects theirs for a short window; returns the ranks
    // not heard from. Every rank an all-reduce still needs is stuck in it too and times out
    // within moments, so in an all-reduce these are the ranks that stopped or were cut off. A
    // rank that finished the transfer before the fault and went on waits in the next collective,
    // and answers from there (answer_probes): it is not named.
    STRATA_MPI_DECL std::vector<int> silent_ranks(int lane);
    // While a rank waits (an arrival, a transfer, rank 0's answer), it answers the word of a
    // rank in silent_ranks with its own: a rank that is alive and waiting somewhere else (it
    // finished the transfer that stopped and went on to the next collective, and waits there)
    // is then heard from, and not named among the missing. Nothing to do in a healthy group
    // (one MPI_Iprobe); called once a wait has spun a while.
    STRATA_MPI_DECL void answer_probes(int lane);

    template <Reducible T>
    void mpi_all_reduce(int lane, std::span<T> data, ReduceOp op, const SyncPoint& at);

    template <Reducible T>
    void mpi_broadcast(int lane, std::span<T> data, int root, const SyncPoint& at);

    template <Reducible T>
    void mpi_all_gather(int lane, std::span<T> data, std::span<const std::int64_t> counts, const SyncPoint& at, const Call& call);

    ProcessGroupOptions options_;
    int lanes_ = 1;
    int provided_ = MPI_THREAD_SINGLE;
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
    int local_rank_ = 0, local_size_ = 1;
    Transport transport_ = Transport::SharedMemory;
    std::atomic<bool> failed_{false};
    // shared memory
    MPI_Win win_ = MPI_WIN_NULL;
    Control* ctl_ = nullptr;
    std::vector<char*> bases_;
    std::vector<Lane> lane_;
    // MPI
    struct ControlBuffers {
        // arrival_check: this rank's word (the arrival number, then its Call), rank 0's answer
        // (0: go; n > 0: n ranks are missing, their ranks follow; −1: rank answer[1]'s call
        // differs, rank 0's and its Call follow) and, on rank 0, every rank's word.
        static constexpr int word = 5, answer_words = 10;
        std::uint64_t mine[word]{};
        std::int64_t answer[answer_words]{};
        std::vector<std::uint64_t> got;
        std::vector<int> late, late_in;
        std::uint64_t stuck = 0;             // silent_ranks: what this rank sends,
        std::vector<std::uint64_t> stuck_in;  // and what the others sent
        // answer_probes: per rank, the collective it said it was stuck in (0: not heard from),
        // the receive buffer of one such word, and the word this rank answers with.
        std::vector<std::uint64_t> heard;
        std::uint64_t probe_in = 0, reply = 0;
    };
    std::unique_ptr<ControlBuffers[]> control_;
    std::vector<MPI_Comm> lane_comms_, control_comms_;
    std::vector<std::vector<std::byte>> ring_in_;  // per lane: the chunk a ring step receives (kept by a failed group)
    std::vector<std::vector<int>> gatherv_;         // per lane: MPI_Iallgatherv's counts and displacements (kept likewise)
    std::vector<std::vector<std::byte>> hier_scratch_;   // per lane: hier_all_gather's packed parts
    std::vector<std::vector<std::int64_t>> hier_plan_;   // per lane: and where they go
    std::vector<std::uint64_t> seq_;
    std::mutex mpi_mutex_;
    // host layout and the hierarchical transport's stages
    int fake_hosts_ = 0;
    std::vector<int> host_of_, host_local_;          // per rank: its host, its index there
    std::vector<std::string> host_names_;            // per host (in host_of_'s numbering)
    std::unique_ptr<ProcessGroup> inner_, outer_;    // this host's ranks; the hosts' leaders (on leaders)
    std::vector<CrossHostStats> cross_;              // per lane
    std::vector<int> names_;                         // a stage's ranks as ranks of the whole job
    int named_size_ = 0;
    std::string stage_;                              // where(): which stage of a hierarchical group
    // The job's stop channel (distribute/stop_agreement.hpp) when this is the first group that
    // spans every rank of the job: fit agrees on its stops through it, on lane 0, from the
    // thread that runs fit, between steps (when no replica thread uses the lane).
    struct JobStop final : StopChannel {
        ProcessGroup* group = nullptr;
        void sum_over_job(std::span<double> values) override {
            group->all_reduce(0, values, ReduceOp::Sum, SyncPoint{"all_reduce", "the stop request (fit)"});
        }
    } job_stop_;
};

// ---- the member templates, for float and double compiled once in the MPI compiled part ----

template <Reducible T>
void ProcessGroup::all_reduce(int lane, std::span<T> data, ReduceOp op, SyncPoint at) {
    check_lane(lane, at);
    if (size_ == 1) {
        throw_if_failed(at);
        return;
    }
    if (transport_ == Transport::Hierarchical) hier_all_reduce(lane, data, op, at);
    else if (transport_ == Transport::SharedMemory) shm_all_reduce(lane, data, op, at);
    else mpi_all_reduce(lane, data, op, at);
}

template <Reducible T>
void ProcessGroup::broadcast(int lane, std::span<T> data, int root, SyncPoint at) {
    check_lane(lane, at);
    STRATA_CHECK(root >= 0 && root < size_, ValueError, at.str(), ": root ", root, " is outside [0, ", size_, ")");
    if (size_ == 1) return;
    if (transport_ == Transport::Hierarchical) hier_broadcast(lane, data, root, at);
    else if (transport_ == Transport::SharedMemory) shm_broadcast(lane, data, root, at);
    else mpi_broadcast(lane, data, root, at);
}

template <Reducible T>
void ProcessGroup::all_gather(int lane, std::span<T> data, std::span<const std::int64_t> counts, SyncPoint at) {
    check_lane(lane, at);
    STRATA_CHECK(std::int64_t(counts.size()) == size_, ValueError, at.str(), ": ", counts.size(), " part sizes for ", size_,
                 " ranks; all_gather takes one per rank");
    std::int64_t total = 0;
    for (int q = 0; q < size_; ++q) {
        const std::int64_t c = counts[std::size_t(q)];
        STRATA_CHECK(c >= 0, ValueError, at.str(), ": rank ", q, "'s part has ", c, " elements");
        total += c;
    }
    STRATA_CHECK(total == std::int64_t(data.size()), ShapeError, at.str(), ": the parts hold ", total, " elements, the buffer ",
                 data.size());
    if (size_ == 1) {
        throw_if_failed(at);
        return;
    }
    if (transport_ == Transport::SharedMemory) {
        shm_all_gather(lane, data, counts, at, call_of<T>(data.size(), gather_root, parts_key(counts)));
    } else if (transport_ == Transport::Mpi) {
        mpi_all_gather(lane, data, counts, at, call_of<T>(data.size(), gather_root, parts_key(counts)));
    } else {
        hier_all_gather(lane, data, counts, at);
    }
}

template <Reducible T>
void ProcessGroup::hier_all_gather(int lane, std::span<T> data, std::span<const std::int64_t> counts, const SyncPoint& at) {
    const int hosts = num_hosts(), h = host_index();
    // Where each rank's part sits in the buffer (rank order) and in the packed one (host by
    // host, a host's ranks in rank order); each host's block; this host's ranks' parts.
    auto& plan = hier_plan_[std::size_t(lane)];
    plan.assign(std::size_t(3 * size_ + 3 * hosts), 0);
    std::int64_t* at_data = plan.data();
    std::int64_t* at_packed = at_data + size_;
    std::int64_t* inner_counts = at_packed + size_;  // in inner-rank order
    std::int64_t* host_first = inner_counts + size_;
    std::int64_t* host_count = host_first + hosts;
    std::int64_t* filled = host_count + hosts;
    for (int q = 1; q < size_; ++q) at_data[q] = at_data[q - 1] + counts[std::size_t(q - 1)];
    for (int q = 0; q < size_; ++q) host_count[host_of_[std::size_t(q)]] += counts[std::size_t(q)];
    for (int g = 1; g < hosts; ++g) host_first[g] = host_first[g - 1] + host_count[g - 1];
    std::copy(host_first, host_first + hosts, filled);
    for (int q = 0, local = 0; q < size_; ++q) {
        const int g = host_of_[std::size_t(q)];
        at_packed[q] = filled[g];
        filled[g] += counts[std::size_t(q)];
        if (g == h) inner_counts[local++] = counts[std::size_t(q)];
    }
    auto& scratch = hier_scratch_[std::size_t(lane)];
    if (scratch.size() < data.size() * sizeof(T)) scratch.resize(data.size() * sizeof(T));
    T* packed = reinterpret_cast<T*>(scratch.data());
    // Both stages compare the whole job's counts (not their own stage's): ranks whose parts
    // differ are refused even where their host's block or their own part looks the same.
    const Call call = call_of<T>(data.size(), gather_root, parts_key(counts));
    hierarchical(at, [&] {
        detail::copy(packed + at_packed[rank_], data.data() + at_data[rank_], std::size_t(counts[std::size_t(rank_)]));
        if (inner_->size() > 1)
            inner_->shm_all_gather(lane, std::span<T>(packed + host_first[h], std::size_t(host_count[h])),
                                   std::span<const std::int64_t>(inner_counts, std::size_t(inner_->size())), at, call);
        if (outer_ && outer_->size() > 1) {
            const auto t0 = clock::now();
            between_hosts([&] {
                outer_->mpi_all_gather(lane, std::span<T>(packed, data.size()), std::span<const std::int64_t>(host_count, std::size_t(hosts)),
                                       at, call);
            });
            auto& c = cross_[std::size_t(lane)];
            ++c.calls;
            c.bytes += host_count[h] * std::int64_t(sizeof(T));
            c.seconds += std::chrono::duration<double>(clock::now() - t0).count();
        }
        if (outer_ || hosts == 1)  // the leader (or, on one host, every rank): every part to its place
            for (int q = 0; q < size_; ++q)
                if (q != rank_) detail::copy(data.data() + at_data[q], packed + at_packed[q], std::size_t(counts[std::size_t(q)]));
        if (hosts > 1) leader_broadcast(lane, data, at);
    });
}

template <class F>
void ProcessGroup::hierarchical(const SyncPoint& at, F&& stages) {
    throw_if_failed(at);
    try {
        stages();
    } catch (const std::exception& e) {
        if (!dynamic_cast<const ShapeError*>(&e)) {
            mark_failed();
            if (inner_) inner_->abort(std::string("rank ") + std::to_string(rank_) + ": " + e.what());
        }
        throw;
    }
}

template <class F>
void ProcessGroup::between_hosts(F&& stage) {
    try {
        stage();
    } catch (const ShapeError& e) {
        mark_failed();
        if (inner_) inner_->abort(std::string("rank ") + std::to_string(rank_) + ": " + e.what());
        throw;
    }
}

template <Reducible T>
void ProcessGroup::hier_all_reduce(int lane, std::span<T> data, ReduceOp op, const SyncPoint& at) {
    hierarchical(at, [&] {
        inner_->all_reduce(lane, data, ReduceOp::Sum, at);
        if (outer_) {
            const auto t0 = clock::now();
            between_hosts([&] { outer_->all_reduce(lane, data, ReduceOp::Sum, at); });
            auto& c = cross_[std::size_t(lane)];
            ++c.calls;
            c.bytes += std::int64_t(data.size() * sizeof(T));
            c.seconds += std::chrono::duration<double>(clock::now() - t0).count();
        }
        leader_broadcast(lane, data, at);
    });
    if (op == ReduceOp::Mean)
        for (auto& v : data) v /= T(size_);
}

template <Reducible T>
void ProcessGroup::hier_broadcast(int lane, std::span<T> data, int root, const SyncPoint& at) {
    const int root_host = host_of_[std::size_t(root)];
    const bool mine = host_index() == root_host;
    hierarchical(at, [&] {
        if (mine) inner_->broadcast(lane, data, host_local_[std::size_t(root)], at);
        if (outer_) between_hosts([&] { outer_->broadcast(lane, data, root_host, at); });
        if (!mine) leader_broadcast(lane, data, at);
    });
}

template <Reducible T>
void ProcessGroup::leader_broadcast(int lane, std::span<T> data, const SyncPoint& at) {
    if (inner_->size() == 1) return;
    inner_->throw_if_failed(at);
    inner_->shm_broadcast(lane, data, 0, at, outer_ || num_hosts() == 1 ? std::chrono::milliseconds{} : 3 * options_.timeout);
}

template <Reducible T>
void ProcessGroup::shm_all_reduce(int lane, std::span<T> data, ReduceOp op, const SyncPoint& at) {
    Lane& ln = lane_state(lane);
    publish(lane, call_of<T>(data.size(), reduce_root));
    const std::size_t cap = std::max<std::size_t>(1, options_.chunk_bytes / sizeof(T));
    if (data.empty()) {
        arrive_and_wait(lane, ++ln.seq, at);
        validate(lane, at);
        return;
    }
    const int n = size_, r = rank_;
    bool first = true;
    for (std::size_t off = 0; off < data.size(); off += cap) {
        const std::size_t len = std::min(cap, data.size() - off);
        T* mine = data.data() + off;
        const std::uint64_t chunk = ln.chunks++;
        T* stage = staging<T>(r, lane, chunk);
        // 1. Stage the slices the others reduce.
        for (int q = 0; q < n; ++q)
            if (q != r) {
                const std::size_t b = chunk_begin(len, n, q);
                detail::copy(stage + b, mine + b, chunk_begin(len, n, q + 1) - b);
            }
        arrive_and_wait(lane, ++ln.seq, at);
        if (first) {
            validate(lane, at);
            first = false;
        }
        // 2. Reduce our slice: our own term first, then ranks r+1, r+2, ... (mod n).
        const std::size_t b = chunk_begin(len, n, r), e = chunk_begin(len, n, r + 1);
        for (int k = 1; k < n; ++k) {
            const T* other = staging<T>((r + k) % n, lane, chunk) + b;
            if (op == ReduceOp::Mean && k == n - 1) detail::add_into_divided(mine + b, other, e - b, T(n));
            else detail::add_into(mine + b, other, e - b);
        }
        detail::copy(stage + b, mine + b, e - b);
        arrive_and_wait(lane, ++ln.seq, at);
        // 3. Gather the others' reduced slices.
        for (int k = 1; k < n; ++k) {
            const int q = (r + k) % n;
            const std::size_t qb = chunk_begin(len, n, q);
            detail::copy(mine + qb, staging<T>(q, lane, chunk) + qb, chunk_begin(len, n, q + 1) - qb);
        }
    }
    // No exit barrier: the next chunk stages into the other buffer, and the one after that
    // waits behind a barrier every rank reaches only after it finished reading this one.
}

template <Reducible T>
void ProcessGroup::shm_broadcast(int lane, std::span<T> data, int root, const SyncPoint& at, std::chrono::milliseconds first_wait) {
    Lane& ln = lane_state(lane);
    publish(lane, call_of<T>(data.size(), root));
    const std::size_t cap = std::max<std::size_t>(1, options_.chunk_bytes / sizeof(T));
    if (data.empty()) {
        arrive_and_wait(lane, ++ln.seq, at, first_wait);
        validate(lane, at);
        return;
    }
    bool first = true;
    for (std::size_t off = 0; off < data.size(); off += cap) {
        const std::size_t len = std::min(cap, data.size() - off);
        const std::uint64_t chunk = ln.chunks++;
        if (rank_ == root) detail::copy(staging<T>(root, lane, chunk), data.data() + off, len);
        arrive_and_wait(lane, ++ln.seq, at, first ? first_wait : std::chrono::milliseconds{});
        if (first) {
            validate(lane, at);
            first = false;
        }
        if (rank_ != root) detail::copy(data.data() + off, staging<T>(root, lane, chunk), len);
        // The root restages this buffer two chunks on, after a barrier that every rank
        // reaches only once it has copied this chunk.
    }
}

template <Reducible T>
void ProcessGroup::shm_all_gather(int lane, std::span<T> data, std::span<const std::int64_t> counts, const SyncPoint& at,
                                  const Call& call) {
    Lane& ln = lane_state(lane);
    publish(lane, call);
    if (data.empty()) {
        arrive_and_wait(lane, ++ln.seq, at);
        validate(lane, at);
        return;
    }
    const std::int64_t cap = std::int64_t(std::max<std::size_t>(1, options_.chunk_bytes / sizeof(T)));
    const std::int64_t size = std::int64_t(data.size());
    std::int64_t mine = 0;  // this rank's part: [mine, mine + counts[rank_])
    for (int q = 0; q < rank_; ++q) mine += counts[std::size_t(q)];
    const std::int64_t mine_end = mine + counts[std::size_t(rank_)];
    bool first = true;
    for (std::int64_t off = 0; off < size; off += cap) {
        const std::int64_t end = std::min(size, off + cap);
        const std::uint64_t chunk = ln.chunks++;
        // 1. Stage this rank's elements of the chunk, at their place in it.
        if (const std::int64_t b = std::max(mine, off), e = std::min(mine_end, end); b < e)
            detail::copy(staging<T>(rank_, lane, chunk) + (b - off), data.data() + b, std::size_t(e - b));
        arrive_and_wait(lane, ++ln.seq, at);
        if (first) {
            validate(lane, at);
            first = false;
        }
        // 2. Copy every other rank's elements of the chunk out of its staging buffer. (A rank
        // restages this buffer two chunks on, after a barrier that every rank reaches only once
        // it has copied this chunk, as in shm_broadcast.)
        std::int64_t qb = 0;
        for (int q = 0; q < size_; ++q) {
            const std::int64_t qe = qb + counts[std::size_t(q)];
            if (const std::int64_t b = std::max(qb, off), e = std::min(qe, end); q != rank_ && b < e)
                detail::copy(data.data() + b, staging<T>(q, lane, chunk) + (b - off), std::size_t(e - b));
            qb = qe;
        }
    }
}

template <Reducible T>
void ProcessGroup::mpi_all_gather(int lane, std::span<T> data, std::span<const std::int64_t> counts, const SyncPoint& at,
                                  const Call& call) {
    arrival_check(lane, at, call);
    // MPI's counts and displacements are ints; kept per lane until the next call (a failed
    // transfer may still read them).
    auto& cd = gatherv_[std::size_t(lane)];
    cd.assign(std::size_t(2 * size_), 0);
    std::int64_t displ = 0;
    for (int q = 0; q < size_; ++q) {
        const std::int64_t c = counts[std::size_t(q)];
        STRATA_CHECK(c <= INT_MAX && displ <= INT_MAX, ValueError, at.str(), ": MPI_Iallgatherv counts in int; rank ", q,
                     "'s part (", c, " elements at ", displ, ") does not fit");
        cd[std::size_t(q)] = int(c);
        cd[std::size_t(size_ + q)] = int(displ);
        displ += c;
    }
    MPI_Request req;
    {
        std::unique_lock lock(mpi_mutex_, std::defer_lock);
        if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), cd.data(), cd.data() + size_, mpi::datatype<T>(),
                        lane_comms_[std::size_t(lane)], &req);
    }
    wait_transfer(req, lane, at);
}

template <Reducible T>
void ProcessGroup::mpi_all_reduce(int lane, std::span<T> data, ReduceOp op, const SyncPoint& at) {
    arrival_check(lane, at, call_of<T>(data.size(), reduce_root));
    if (data.size() * sizeof(T) >= options_.ring_min_bytes && std::int64_t(data.size()) >= size_) {
        ring_all_reduce(lane, data, at);
    } else {
        MPI_Request req;
        {
            std::unique_lock lock(mpi_mutex_, std::defer_lock);
            if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
            MPI_Iallreduce(MPI_IN_PLACE, data.data(), int(data.size()), mpi::datatype<T>(), MPI_SUM,
                           lane_comms_[std::size_t(lane)], &req);
        }
        wait_transfer(req, lane, at);
    }
    if (op == ReduceOp::Mean)
        for (auto& v : data) v /= T(size_);
}

template <Reducible T>
void ProcessGroup::ring_all_reduce(int lane, std::span<T> data, const SyncPoint& at) {
    // Chunk c of P (as even as possible) is summed along the ring once, starting at rank c + 1:
    // after P - 1 steps of reduce-scatter rank r holds the whole sum of chunk r + 1, and P - 1
    // steps of all-gather copy every sum to every rank. Each rank sends and receives
    // 2 (P - 1) / P of the buffer, both ways at once (bandwidth-optimal); every rank holds the
    // same bits, the same from run to run (each element summed once, in ring order).
    const int p = size_, r = rank_;
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    const auto n = std::int64_t(data.size());
    auto first = [&](int c) { return n * c / p; };
    auto count = [&](int c) { return first(c + 1) - first(c); };
    auto& in = ring_in_[std::size_t(lane)];
    const std::int64_t most = (n + p - 1) / p;
    if (in.size() < std::size_t(most) * sizeof(T)) in.resize(std::size_t(most) * sizeof(T));
    T* got = reinterpret_cast<T*>(in.data());
    MPI_Comm c = lane_comms_[std::size_t(lane)];
    constexpr int tag = 7;
    auto step = [&](int send_c, T* recv_into, int recv_c) {
        MPI_Request reqs[2];
        {
            std::unique_lock lock(mpi_mutex_, std::defer_lock);
            if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
            MPI_Irecv(recv_into, int(count(recv_c)), mpi::datatype<T>(), prev, tag, c, &reqs[0]);
            MPI_Isend(data.data() + first(send_c), int(count(send_c)), mpi::datatype<T>(), next, tag, c, &reqs[1]);
        }
        wait_transfers(reqs, lane, at);
    };
    for (int s = 0; s < p - 1; ++s) {  // reduce-scatter
        const int send_c = (r - s + p) % p, recv_c = (r - s - 1 + 2 * p) % p;
        step(send_c, got, recv_c);
        T* mine = data.data() + first(recv_c);
        const std::int64_t m = count(recv_c);
        for (std::int64_t i = 0; i < m; ++i) mine[i] = got[i] + mine[i];  // the ring's partial sum, then this rank's
    }
    for (int s = 0; s < p - 1; ++s) {  // all-gather
        const int send_c = (r + 1 - s + p) % p, recv_c = (r - s + p) % p;
        step(send_c, data.data() + first(recv_c), recv_c);
    }
}

template <Reducible T>
void ProcessGroup::mpi_broadcast(int lane, std::span<T> data, int root, const SyncPoint& at) {
    arrival_check(lane, at, call_of<T>(data.size(), root));
    MPI_Request req;
    {
        std::unique_lock lock(mpi_mutex_, std::defer_lock);
        if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
        MPI_Ibcast(data.data(), int(data.size()), mpi::datatype<T>(), root, lane_comms_[std::size_t(lane)], &req);
    }
    wait_transfer(req, lane, at);
}

#if STRATA_MPI_INSTANCES
STRATA_MPI_TEMPLATE void ProcessGroup::all_reduce<float>(int, std::span<float>, ReduceOp, SyncPoint);
STRATA_MPI_TEMPLATE void ProcessGroup::all_reduce<double>(int, std::span<double>, ReduceOp, SyncPoint);
STRATA_MPI_TEMPLATE void ProcessGroup::all_gather<float>(int, std::span<float>, std::span<const std::int64_t>, SyncPoint);
STRATA_MPI_TEMPLATE void ProcessGroup::all_gather<double>(int, std::span<double>, std::span<const std::int64_t>, SyncPoint);
STRATA_MPI_TEMPLATE void ProcessGroup::shm_all_gather<float>(int, std::span<float>, std::span<const std::int64_t>, const SyncPoint&, const Call&);
STRATA_MPI_TEMPLATE void ProcessGroup::shm_all_gather<double>(int, std::span<double>, std::span<const std::int64_t>, const SyncPoint&, const Call&);
STRATA_MPI_TEMPLATE void ProcessGroup::mpi_all_gather<float>(int, std::span<float>, std::span<const std::int64_t>, const SyncPoint&, const Call&);
STRATA_MPI_TEMPLATE void ProcessGroup::mpi_all_gather<double>(int, std::span<double>, std::span<const std::int64_t>, const SyncPoint&, const Call&);
STRATA_MPI_TEMPLATE void ProcessGroup::broadcast<float>(int, std::span<float>, int, SyncPoint);
STRATA_MPI_TEMPLATE void ProcessGroup::broadcast<double>(int, std::span<double>, int, SyncPoint);
STRATA_MPI_TEMPLATE void ProcessGroup::hier_all_reduce<float>(int, std::span<float>, ReduceOp, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::hier_all_gather<float>(int, std::span<float>, std::span<const std::int64_t>, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::hier_all_reduce<double>(int, std::span<double>, ReduceOp, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::hier_all_gather<double>(int, std::span<double>, std::span<const std::int64_t>, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::hier_broadcast<float>(int, std::span<float>, int, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::hier_broadcast<double>(int, std::span<double>, int, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::leader_broadcast<float>(int, std::span<float>, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::leader_broadcast<double>(int, std::span<double>, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::shm_all_reduce<float>(int, std::span<float>, ReduceOp, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::shm_all_reduce<double>(int, std::span<double>, ReduceOp, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::shm_broadcast<float>(int, std::span<float>, int, const SyncPoint&, std::chrono::milliseconds);
STRATA_MPI_TEMPLATE void ProcessGroup::shm_broadcast<double>(int, std::span<double>, int, const SyncPoint&, std::chrono::milliseconds);
STRATA_MPI_TEMPLATE void ProcessGroup::mpi_all_reduce<float>(int, std::span<float>, ReduceOp, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::mpi_all_reduce<double>(int, std::span<double>, ReduceOp, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::mpi_broadcast<float>(int, std::span<float>, int, const SyncPoint&);
STRATA_MPI_TEMPLATE void ProcessGroup::mpi_broadcast<double>(int, std::span<double>, int, const SyncPoint&);
#endif

}  // namespace strata::distribute::collective

#if STRATA_MPI_DEFINITIONS
#include "strata/distribute/collective/impl/process_group.ipp"
#endif
