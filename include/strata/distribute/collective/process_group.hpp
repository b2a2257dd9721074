#pragma once
/// \file strata/distribute/collective/process_group.hpp
/// Collectives among the processes of an MPI job (one rank per process): all-reduce, broadcast
/// and barrier, where every wait has a deadline and a rank that does not arrive is named. It is
/// the cross-process stage of MultiWorkerMirrored's hierarchical all-reduce (see
/// strata/distribute/multi_worker_mirrored.hpp) and needs <mpi.h> (OpenMPI or MPICH, MPI-3).
///
/// Three transports:
/// - SharedMemory (Auto's choice when every rank is on one host): an MPI-3 shared window
///   (MPI_Win_allocate_shared) holds, per rank, an arrival counter per lane and two staging
///   buffers per lane. A collective is a direct reduce-scatter + all-gather through them,
///   synchronised by the counters, which is what lets a waiting rank see exactly which ranks
///   are late (MPI itself has no collective with a timeout). No MPI call is made per step.
/// - Mpi (Auto's choice across hosts, or forced): MPI_Iallreduce / MPI_Ibcast on a
///   communicator per lane, polled against the deadline; before each collective the ranks
///   report their arrival to rank 0, which names whoever is missing.
/// - Hierarchical (Auto's choice when several hosts hold several ranks each): the ranks are
///   grouped by host; inside a host a shared-memory group all-reduces, the host's leader (its
///   lowest rank) all-reduces the host's sum with the other leaders over MPI, and broadcasts the
///   result back through shared memory (the two-level all-reduce of Horovod's hierarchical mode,
///   with one leader per host). The cross-host stage's bytes and time are counted
///   (cross_host_stats()). On one machine a layout of several hosts is declared with
///   ProcessGroupOptions::fake_hosts or the environment variable STRATA_FAKE_HOSTS=H: the ranks
///   are split into H hosts of consecutive ranks (4 ranks, H = 2: {0, 1} and {2, 3}).
///
/// Lanes: up to `lanes` threads of a process may call collectives at the same time, each on its
/// own lane (MultiWorkerMirrored gives each local replica a lane, so that the R slices of a
/// gradient bucket cross processes in parallel). Calls on one lane pair up in program order
/// across ranks, as in MPI.
///
/// Joining: the constructor first exchanges every rank's settings (lanes, transport, timeout,
/// chunk size, and whatever ProcessGroupOptions::settings adds) point to point on the caller's
/// communicator, tags 0x5374 and 0x5375 (a program must not use them on it), polled against
/// the timeout; ranks that are not there are named, settings that differ are refused on every
/// rank, and only then are the collective MPI calls of the set-up made. agree() checks more
/// settings later (MultiWorkerMirrored's model and optimizer).
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

#include <strata/core/error.hpp>
#include <strata/distribute/collective/common.hpp>
#include <strata/distribute/launcher.hpp>
#include <strata/distribute/rendezvous.hpp>
#include <strata/distribute/settings.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
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
};

/// What the cross-host stage of the hierarchical transport did on this rank (a host leader;
/// zero elsewhere): all-reduce calls, payload bytes each leader put into them, seconds spent.
struct CrossHostStats {
    std::int64_t calls = 0;
    std::int64_t bytes = 0;
    double seconds = 0;
};

namespace detail {
// Settings as bytes: every name and value as its length (8 bytes) and its text.
inline void put_text(std::string& out, std::string_view s) {
    const std::uint64_t n = s.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out.append(s);
}
inline bool get_text(std::string_view& in, std::string& s) {
    std::uint64_t n = 0;
    if (in.size() < sizeof n) return false;
    std::memcpy(&n, in.data(), sizeof n);
    in.remove_prefix(sizeof n);
    if (in.size() < n) return false;
    s.assign(in.data(), std::size_t(n));
    in.remove_prefix(std::size_t(n));
    return true;
}
inline std::string encode(const Settings& settings) {
    std::string out;
    for (const auto& [name, value] : settings) {
        put_text(out, name);
        put_text(out, value);
    }
    return out;
}
inline Settings decode(std::string_view in) {
    Settings out;
    std::string name, value;
    while (!in.empty()) {
        if (!get_text(in, name) || !get_text(in, value))
            throw DistributedError("ProcessGroup: a peer sent settings that do not decode (is every process the same program?)");
        out.emplace_back(name, value);
    }
    return out;
}

// "rank 1" / "ranks 0, 2".
inline std::string rank_list(const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s;
}

// Every setting whose value is not the same on every rank, with who has what:
// "transport: rank 0 has mpi, rank 1 has shared_memory; batch_size: ranks 0, 2 have 128, rank 1
// has 64". Empty when the ranks agree. A setting a rank does not have reads "(not set)".
inline std::string disagreements(const std::vector<Settings>& per_rank) {
    std::vector<std::string> names;
    for (const auto& settings : per_rank)
        for (const auto& [name, value] : settings)
            if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    std::string out;
    for (const auto& name : names) {
        std::vector<std::pair<std::string, std::vector<int>>> groups;  // value, ranks with it
        for (std::size_t q = 0; q < per_rank.size(); ++q) {
            std::string v = "(not set)";
            for (const auto& [n, value] : per_rank[q])
                if (n == name) v = value.empty() ? "(none)" : value;
            auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == v; });
            if (g == groups.end()) groups.push_back({v, {int(q)}});
            else g->second.push_back(int(q));
        }
        if (groups.size() == 1) continue;
        out += (out.empty() ? "" : "; ") + name + ": ";
        for (std::size_t i = 0; i < groups.size(); ++i)
            out += (i ? ", " : "") + rank_list(groups[i].second) + (groups[i].second.size() == 1 ? " has " : " have ") +
                   groups[i].first;
    }
    return out;
}
}  // namespace detail

namespace mpi {

/// Set when any ProcessGroup of this process failed: MPI_Finalize, which waits for every
/// rank, is then skipped at exit, and the launcher ends the job (it sees a process exit
/// without finalizing).
inline std::atomic<bool>& job_failed() {
    static std::atomic<bool> failed{false};
    return failed;
}

/// Throws DistributedError when a launcher started several processes (srun, mpiexec: see
/// launcher.hpp) but MPI sees this one alone: MPI was not initialised through the launcher's
/// process manager (srun without a PMI plug-in that this MPI speaks), so every process would
/// train as its own one-process job.
inline void check_launcher() {
    const LaunchInfo launch = launch_info();
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world == 1 && launch.size > 1)
        throw DistributedError("MPI sees 1 process (MPI_COMM_WORLD has 1 rank), but " + launch.describe() +
                               ": MPI was not initialised through the launcher, so each process would train alone. Expected " +
                               std::to_string(launch.size) + " ranks: under Slurm use srun --mpi=pmix (or pmi2; srun --mpi=list "
                               "shows what this Slurm offers) with an MPI built for it, or mpirun inside the allocation");
}

/// Initializes MPI (MPI_THREAD_MULTIPLE asked for) unless the program already did, and
/// finalizes it at exit if strata initialized it. Returns the thread level MPI provides.
/// Throws DistributedError when a launcher started several processes but MPI sees one
/// (check_launcher).
inline int ensure_initialized() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
        if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            throw DistributedError("MultiWorkerMirrored: MPI_Init_thread failed (is this program started by mpirun or srun?)");
        std::atexit([] {
            int finalized = 0;
            MPI_Finalized(&finalized);
            if (!finalized && !job_failed()) MPI_Finalize();
        });
    } else {
        MPI_Query_thread(&provided);
    }
    check_launcher();
    return provided;
}

inline int world_rank() {
    ensure_initialized();
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

inline int world_size() {
    ensure_initialized();
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

/// This process's index among the processes of `comm` on its host.
inline int local_rank(MPI_Comm comm = MPI_COMM_WORLD) {
    ensure_initialized();
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int r = 0;
    MPI_Comm_rank(node, &r);
    MPI_Comm_free(&node);
    return r;
}

/// Processes of `comm` on this host (MPI_COMM_TYPE_SHARED).
inline int local_size(MPI_Comm comm = MPI_COMM_WORLD) {
    ensure_initialized();
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int n = 1;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n;
}

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
    /// lanes, the transport asked for, the timeout, chunk_bytes and options.settings. A rank
    /// that does not come is named (DistributedError `rank 1 of 2 did not arrive within 60000
    /// ms`); settings that differ are a ValueError on every rank naming each one and which rank
    /// has what (`transport: rank 0 has mpi, rank 1 has shared_memory`). Only then are the
    /// group's communicators and window made (MPI_Comm_idup polled; MPI_Win_allocate_shared,
    /// which has no non-blocking form, once every rank is known to have agreed).
    ProcessGroup(MPI_Comm comm, int lanes, ProcessGroupOptions options = {}) : options_(options), lanes_(lanes) {
        STRATA_CHECK(lanes >= 1 && lanes <= 64, ValueError, "ProcessGroup: lanes must be in [1, 64], got ", lanes);
        STRATA_CHECK(options.timeout.count() > 0, ValueError, "ProcessGroup: the timeout must be > 0 ms, got ",
                     options.timeout.count(), " ms");
        STRATA_CHECK(options.chunk_bytes >= 1024, ValueError, "ProcessGroup: chunk_bytes must be >= 1024, got ",
                     options.chunk_bytes);
        provided_ = mpi::ensure_initialized();
        MPI_Comm_rank(comm, &rank_);
        MPI_Comm_size(comm, &size_);
        if (options_.stall_warning.count() == 0) options_.stall_warning = options_.timeout / 2;
        join(comm);
        transport_ = options_.transport;
        const int hosts = host_count();
        if (transport_ == Transport::Auto)
            transport_ = hosts == 1 ? Transport::SharedMemory : hosts == size_ ? Transport::Mpi : Transport::Hierarchical;
        STRATA_CHECK(transport_ != Transport::SharedMemory || hosts == 1, ValueError,
                     "ProcessGroup: the shared-memory transport needs every rank on one host; the ", size_, " ranks are on ",
                     hosts, " hosts", fake_hosts_ > 0 ? " (STRATA_FAKE_HOSTS / fake_hosts)" : "",
                     " (use Transport::Hierarchical, Mpi or Auto)");
        const SyncPoint setup{"set-up", "process group"};
        comm_ = dup(comm, setup);
        if (transport_ == Transport::Hierarchical) {
            open_hierarchy();
        } else if (transport_ == Transport::SharedMemory) {
            open_window();
        } else {
            lane_comms_.resize(std::size_t(lanes_));
            control_comms_.resize(std::size_t(lanes_));
            for (int l = 0; l < lanes_; ++l) {
                lane_comms_[std::size_t(l)] = dup(comm_, setup);
                control_comms_[std::size_t(l)] = dup(comm_, setup);
            }
            seq_.assign(std::size_t(lanes_), 0);
            control_ = std::make_unique<ControlBuffers[]>(std::size_t(lanes_));
        }
    }

    ProcessGroup(const ProcessGroup&) = delete;
    ProcessGroup& operator=(const ProcessGroup&) = delete;

    /// Frees the window and communicators, which MPI does collectively: only after a closing
    /// barrier with the usual deadline shows that every rank is here too. When a rank is
    /// missing (or the group failed, or the job lost a rank: mpi::job_failed()) nothing is
    /// freed: a collective free would hang, and the barrier would wait a timeout for nobody.
    ~ProcessGroup() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (failed_ || mpi::job_failed()) {
            (void)control_.release();  // receives may still be posted into it
            (void)inner_.release();    // their closing barriers would wait for ranks that are gone
            (void)outer_.release();
        }
        if (finalized || failed_ || mpi::job_failed()) return;
        try {
            barrier(0, SyncPoint{"barrier", "closing the process group"});
        } catch (...) {
            return;  // named on stderr by nobody: the job is failing already
        }
        if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
        for (auto& c : lane_comms_) MPI_Comm_free(&c);
        for (auto& c : control_comms_) MPI_Comm_free(&c);
        MPI_Comm_free(&comm_);
    }

    [[nodiscard]] int rank() const noexcept { return rank_; }
    [[nodiscard]] int size() const noexcept { return size_; }
    [[nodiscard]] int lanes() const noexcept { return lanes_; }
    [[nodiscard]] Transport transport() const noexcept { return transport_; }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return options_.timeout; }
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
    [[nodiscard]] CrossHostStats cross_host_stats() const {
        CrossHostStats out;
        for (const auto& s : cross_) {
            out.calls += s.calls;
            out.bytes += s.bytes;
            out.seconds += s.seconds;
        }
        return out;
    }

    /// Checks that every rank passes the same `settings` (what = what they are, for the
    /// message), e.g. once at set-up: the ranks exchange them point to point, polled against
    /// the timeout. Throws, on every rank alike, ValueError `ProcessGroup: the ranks disagree on
    /// the optimizer: optimizer: rank 0 has Adam(...), rank 1 has SGD(...)` naming every
    /// setting that differs; DistributedError naming a rank that does not come (the group is
    /// then failed). Requires: every rank calls it at the same point, from one thread, never
    /// concurrently with another agree(); collectives on the lanes may run meanwhile.
    void agree(const Settings& settings, std::string_view what = "settings") {
        const SyncPoint at{"agree", what};
        throw_if_failed(at);
        if (size_ == 1) return;
        const auto all = exchange(comm_, agree_tag, detail::encode(settings), at, [this] { mark_failed(); });
        std::vector<Settings> per_rank;
        for (const auto& bytes : all) per_rank.push_back(detail::decode(bytes));
        const std::string d = detail::disagreements(per_rank);
        if (!d.empty()) throw_error<ValueError>("ProcessGroup: the ranks disagree on ", what, ": ", d);
    }
    /// One setting: agree({{name, value}}).
    void agree(std::string_view name, std::string_view value) { agree(Settings{{std::string(name), std::string(value)}}, name); }

    /// Sums (or averages) `data` over the ranks, in place, on `lane`.
    /// Throws ShapeError (shared memory: on every rank) when the ranks' lengths differ,
    /// DistributedError on a timeout or after a peer's abort.
    template <Reducible T>
    void all_reduce(int lane, std::span<T> data, ReduceOp op = ReduceOp::Sum, SyncPoint at = {"all_reduce"}) {
        check_lane(lane, at);
        if (size_ == 1) {
            throw_if_failed(at);
            return;
        }
        if (transport_ == Transport::Hierarchical) hier_all_reduce(lane, data, op, at);
        else if (transport_ == Transport::SharedMemory) shm_all_reduce(lane, data, op, at);
        else mpi_all_reduce(lane, data, op, at);
    }

    /// Sums `data` (int64 counters) over the ranks, in place.
    void all_reduce_counts(int lane, std::span<std::int64_t> data, SyncPoint at = {"all_reduce"}) {
        // Counters are exact in double up to 2^53.
        std::vector<double> d(data.begin(), data.end());
        all_reduce(lane, std::span<double>(d), ReduceOp::Sum, at);
        for (std::size_t i = 0; i < data.size(); ++i) data[i] = std::int64_t(d[i]);
    }

    /// Copies rank `root`'s `data` to every rank.
    template <Reducible T>
    void broadcast(int lane, std::span<T> data, int root = 0, SyncPoint at = {"broadcast"}) {
        check_lane(lane, at);
        STRATA_CHECK(root >= 0 && root < size_, ValueError, at.str(), ": root ", root, " is outside [0, ", size_, ")");
        if (size_ == 1) return;
        if (transport_ == Transport::Hierarchical) hier_broadcast(lane, data, root, at);
        else if (transport_ == Transport::SharedMemory) shm_broadcast(lane, data, root, at);
        else mpi_broadcast(lane, data, root, at);
    }

    /// Waits until every rank called barrier() on `lane`.
    void barrier(int lane = 0, SyncPoint at = {"barrier"}) {
        check_lane(lane, at);
        if (size_ == 1) return;
        if (transport_ == Transport::Hierarchical) {
            hierarchical(at, [&] {
                inner_->barrier(lane, at);
                if (outer_) outer_->barrier(lane, at);
                inner_->barrier(lane, at);
            });
        } else if (transport_ == Transport::SharedMemory) {
            Lane& ln = lane_state(lane);
            arrive_and_wait(lane, ++ln.seq, at);
        } else {
            arrival_check(lane, at);
        }
    }

    /// Marks the group failed on every rank because of `message` (a local replica threw): the
    /// other ranks' waits end at once with DistributedError naming this rank. Never throws.
    void abort(std::string_view message) noexcept {
        if (failed_) return;
        mark_failed();
        if (inner_) inner_->abort(message);  // the host's other ranks stop at once; other hosts at their deadline
        if (transport_ == Transport::SharedMemory && ctl_ != nullptr) {
            Control& me = control(rank_);
            const std::size_t n = std::min(message.size(), sizeof(me.message) - 1);
            std::memcpy(me.message, message.data(), n);
            me.message[n] = '\0';
            me.aborted.store(1, std::memory_order_release);
        }
        // Over MPI there is no side channel that a waiting peer polls: it reaches its deadline
        // (or the launcher ends the job when this process exits non-zero).
    }

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
    void join(MPI_Comm comm) {
        char host[MPI_MAX_PROCESSOR_NAME] = {};
        int host_len = 0;
        MPI_Get_processor_name(host, &host_len);
        fake_hosts_ = options_.fake_hosts;
        if (fake_hosts_ < 0) fake_hosts_ = fake_hosts_from_environment();
        Settings mine{{"lanes", std::to_string(lanes_)},
                      {"transport", std::string(to_string(options_.transport))},
                      {"timeout_ms", std::to_string(options_.timeout.count())},
                      {"chunk_bytes", std::to_string(options_.chunk_bytes)},
                      {"fake_hosts (STRATA_FAKE_HOSTS)", fake_hosts_ > 0 ? std::to_string(fake_hosts_) : std::string()}};
        for (const auto& s : options_.settings) mine.push_back(s);
        local_rank_ = 0;
        local_size_ = 1;
        host_of_.assign(std::size_t(size_), 0);
        host_local_.assign(std::size_t(size_), 0);
        if (size_ == 1) {
            check_fake_hosts();
            return;
        }
        std::string bytes = detail::encode(mine);
        detail::put_text(bytes, "");  // the host name last, outside the settings compared
        detail::put_text(bytes, std::string_view(host, std::size_t(host_len)));
        const auto all = exchange(comm, join_tag, bytes, SyncPoint{"set-up", "process group"}, [] { mpi::job_failed() = true; });
        std::vector<Settings> per_rank;
        std::vector<std::string> hosts;
        for (const auto& b : all) {
            per_rank.push_back(detail::decode(b));
            hosts.push_back(per_rank.back().empty() ? std::string() : per_rank.back().back().second);
            if (!per_rank.back().empty()) per_rank.back().pop_back();
        }
        local_size_ = int(std::count(hosts.begin(), hosts.end(), hosts[std::size_t(rank_)]));
        local_rank_ = int(std::count(hosts.begin(), hosts.begin() + rank_, hosts[std::size_t(rank_)]));
        int lo = lanes_, hi = lanes_;
        for (const auto& settings : per_rank)
            for (const auto& [name, value] : settings)
                if (name == "lanes") {
                    lo = std::min(lo, std::atoi(value.c_str()));
                    hi = std::max(hi, std::atoi(value.c_str()));
                }
        if (lo != hi)
            throw_error<ValueError>("ProcessGroup: every rank needs the same number of lanes (MultiWorkerMirrored: of local "
                                    "replicas); rank ", rank_, " has ", lanes_, ", the ranks have from ", lo, " to ", hi);
        const std::string d = detail::disagreements(per_rank);
        if (!d.empty())
            throw_error<ValueError>("ProcessGroup: the ranks disagree on their settings (every process must be started with "
                                    "the same ones): ", d);
        check_fake_hosts();
        // The layout the transports use: hosts numbered in the order of their lowest rank.
        std::vector<std::string> seen;
        for (int q = 0; q < size_; ++q) {
            int h = 0;
            if (fake_hosts_ > 0) {
                h = q / (size_ / fake_hosts_);
            } else {
                auto it = std::find(seen.begin(), seen.end(), hosts[std::size_t(q)]);
                h = int(it - seen.begin());
                if (it == seen.end()) seen.push_back(hosts[std::size_t(q)]);
            }
            host_of_[std::size_t(q)] = h;
            host_local_[std::size_t(q)] = int(std::count(host_of_.begin(), host_of_.begin() + q, h));
        }
    }

    // STRATA_FAKE_HOSTS=H (a count >= 1), or 0 when unset or empty.
    static int fake_hosts_from_environment() {
        const char* v = std::getenv("STRATA_FAKE_HOSTS");
        if (v == nullptr || *v == '\0') return 0;
        char* end = nullptr;
        const long n = std::strtol(v, &end, 10);
        if (end == v || *end != '\0' || n < 1 || n > 1 << 20)
            throw_error<ValueError>("ProcessGroup: STRATA_FAKE_HOSTS=", v, ": expected a number of hosts >= 1 (or unset)");
        return int(n);
    }
    // Every rank runs this with the same values (they agreed on them): the same error everywhere.
    void check_fake_hosts() const {
        if (fake_hosts_ > 0 && size_ % fake_hosts_ != 0)
            throw_error<ValueError>("ProcessGroup: STRATA_FAKE_HOSTS=", fake_hosts_, " hosts must divide the ", size_,
                                    " ranks evenly (expected a divisor of ", size_, ", found ", fake_hosts_, ")");
    }
    int host_count() const {
        return host_of_.empty() ? 1 : 1 + *std::max_element(host_of_.begin(), host_of_.end());
    }

    // ---- hierarchical transport ------------------------------------------------------------------

    // A shared-memory group per host and, on each host's leader, an MPI group of the leaders.
    // MPI_Comm_split blocks, but every rank is known to be here and to agree (join).
    void open_hierarchy() {
        const int h = host_index();
        MPI_Comm host_comm = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
        MPI_Comm_split(comm_, h, rank_, &host_comm);
        MPI_Comm_split(comm_, host_rank() == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders);
        ProcessGroupOptions o = options_;
        o.settings.clear();
        o.fake_hosts = 0;
        o.transport = Transport::SharedMemory;
        std::vector<int> members, heads;
        for (int q = 0; q < size_; ++q) {
            if (host_of_[std::size_t(q)] == h) members.push_back(q);
            if (host_local_[std::size_t(q)] == 0) heads.push_back(q);
        }
        inner_.reset(new ProcessGroup(host_comm, lanes_, o));
        inner_->names_ = members;
        inner_->named_size_ = size_;
        inner_->stage_ = " inside host " + std::to_string(h);
        if (leaders != MPI_COMM_NULL) {
            o.transport = Transport::Mpi;
            outer_.reset(new ProcessGroup(leaders, lanes_, o));
            outer_->names_ = heads;
            outer_->named_size_ = size_;
            outer_->stage_ = " between hosts (their leaders)";
            MPI_Comm_free(&leaders);
        }
        MPI_Comm_free(&host_comm);
        cross_.assign(std::size_t(lanes_), CrossHostStats{});
    }

    // Runs a hierarchical collective's stages; a failure in any stage fails this group and
    // stops the host's other ranks at once (the other hosts' leaders at their deadline).
    template <class F>
    void hierarchical(const SyncPoint& at, F&& stages) {
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

    template <Reducible T>
    void hier_all_reduce(int lane, std::span<T> data, ReduceOp op, const SyncPoint& at) {
        hierarchical(at, [&] {
            inner_->all_reduce(lane, data, ReduceOp::Sum, at);
            if (outer_) {
                const auto t0 = clock::now();
                outer_->all_reduce(lane, data, ReduceOp::Sum, at);
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

    // The root's host first (inside it), then its leader to the other leaders, then each other
    // host's leader inside its host.
    template <Reducible T>
    void hier_broadcast(int lane, std::span<T> data, int root, const SyncPoint& at) {
        const int root_host = host_of_[std::size_t(root)];
        const bool mine = host_index() == root_host;
        hierarchical(at, [&] {
            if (mine) inner_->broadcast(lane, data, host_local_[std::size_t(root)], at);
            if (outer_) outer_->broadcast(lane, data, root_host, at);
            if (!mine) leader_broadcast(lane, data, at);
        });
    }

    // The host's leader broadcasts what it brought back from the other hosts. Its ranks wait
    // for it longer than the timeout (3 times: the leaders' arrival check, their transfer and
    // a margin), so that a rank missing on another host is named by the leaders' stage and
    // reaches these ranks as their leader's abort, not as their own timeout naming the leader.
    template <Reducible T>
    void leader_broadcast(int lane, std::span<T> data, const SyncPoint& at) {
        if (inner_->size() == 1) return;
        inner_->throw_if_failed(at);
        inner_->shm_broadcast(lane, data, 0, at, outer_ || num_hosts() == 1 ? std::chrono::milliseconds{} : 3 * options_.timeout);
    }

    // A deadline of `timeout` for a loop that polls at least every millisecond.
    RunningDeadline fresh(std::chrono::milliseconds timeout) const { return RunningDeadline(timeout, poll_interval); }
    static constexpr auto poll_interval = std::chrono::milliseconds(2);

    // MPI_Comm_idup, polled against the timeout.
    MPI_Comm dup(MPI_Comm c, const SyncPoint& at) {
        MPI_Comm out = MPI_COMM_NULL;
        MPI_Request req;
        MPI_Comm_idup(c, &out, &req);
        auto d = fresh(options_.timeout);
        wait_request(req, d, at, 0, "some rank");
        return out;
    }

    // Every rank's `mine`, on every rank, in rank order. Each rank sends it to rank 0 (tag
    // `tag`), which answers (tag + 1) with all of them once every rank came, or with the ranks
    // missing at its deadline; a rank waits for the answer until rank 0's deadline plus the
    // timeout. Point to point and polled: nothing blocks. On failure `failed` runs, the
    // message naming the missing ranks is thrown, and the buffers of requests still in flight
    // are leaked (a send or receive may still touch them).
    template <class OnFailure>
    std::vector<std::string> exchange(MPI_Comm c, int tag, const std::string& mine, const SyncPoint& at, OnFailure failed) {
        struct Buffers {
            std::string out, in;
            std::vector<std::string> got;
            std::vector<MPI_Request> sends;
        };
        auto io = std::make_unique<Buffers>();
        io->out = mine;
        auto locked = [&](auto&& f) {
            std::unique_lock lock(mpi_mutex_, std::defer_lock);
            if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
            f();
        };
        const std::string where = "across processes: " + at.str();
        auto deadline = fresh(options_.timeout);
        auto fail = [&](const std::string& who) {
            failed();
            (void)io.release();
            throw_error<DistributedError>(where, ": ", who, " did not arrive within ", options_.timeout.count(), " ms");
        };
        // Takes a message from `from` with `t` if one is there.
        auto take = [&](int from, int t, std::string& into) {
            int flag = 0;
            MPI_Message m;
            MPI_Status st;
            locked([&] { MPI_Improbe(from, t, c, &flag, &m, &st); });
            if (!flag) return false;
            int n = 0;
            MPI_Get_count(&st, MPI_BYTE, &n);
            into.resize(std::size_t(n));
            locked([&] { MPI_Mrecv(into.data(), n, MPI_BYTE, &m, MPI_STATUS_IGNORE); });
            return true;
        };
        auto pause = [](int spins) {
            if (spins > 256) std::this_thread::sleep_for(std::chrono::microseconds(spins > 4096 ? 1000 : 50));
        };
        if (rank_ != 0) {
            MPI_Request send;
            locked([&] { MPI_Isend(io->out.data(), int(io->out.size()), MPI_BYTE, 0, tag, c, &send); });
            // Rank 0 answers at its own deadline at the latest.
            auto root_deadline = fresh(2 * options_.timeout);
            for (int spins = 0; !take(0, tag + 1, io->in); ++spins) {
                if (root_deadline.expired()) fail("rank 0 of " + std::to_string(size_));
                pause(spins);
            }
            for (int spins = 0;; ++spins) {
                int done = 0;
                locked([&] { MPI_Test(&send, &done, MPI_STATUS_IGNORE); });
                if (done) break;
                if (root_deadline.expired()) fail("rank 0 of " + std::to_string(size_));
                pause(spins);
            }
            std::string_view in(io->in);
            STRATA_CHECK(!in.empty(), DistributedError, where, ": rank 0 sent an empty answer");
            const char kind = in.front();
            in.remove_prefix(1);
            std::vector<std::string> all;
            std::string item;
            while (detail::get_text(in, item)) all.push_back(item);
            if (kind == 'M') {  // the ranks rank 0 did not hear from
                std::vector<int> late;
                for (const auto& r : all) late.push_back(std::atoi(r.c_str()));
                fail(ranks_text(late));
            }
            STRATA_CHECK(int(all.size()) == size_, DistributedError, where, ": rank 0 sent ", all.size(), " ranks' settings, expected ",
                         size_);
            return all;
        }
        io->got.assign(std::size_t(size_), std::string());
        io->got[0] = mine;
        std::vector<char> have(std::size_t(size_), 0);
        have[0] = 1;
        std::vector<int> late;
        bool warned = false;
        for (int spins = 0;; ++spins) {
            late.clear();
            for (int q = 1; q < size_; ++q)
                if (!have[std::size_t(q)] && !(have[std::size_t(q)] = char(take(q, tag, io->got[std::size_t(q)])))) late.push_back(q);
            if (late.empty() || deadline.expired()) break;
            const auto waited = deadline.waited();
            if (!warned && options_.stall_warning.count() > 0 && waited > options_.stall_warning) {
                warned = true;
                std::fprintf(stderr, "strata: warning: %s: rank 0 has waited %lld ms for %s (timeout %lld ms)\n", where.c_str(),
                             static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()),
                             ranks_text(late).c_str(), static_cast<long long>(options_.timeout.count()));
            }
            pause(spins);
        }
        io->out.assign(1, late.empty() ? 'A' : 'M');
        if (late.empty())
            for (const auto& g : io->got) detail::put_text(io->out, g);
        else
            for (int q : late) detail::put_text(io->out, std::to_string(q));
        for (int q = 1; q < size_; ++q) {
            if (!have[std::size_t(q)]) continue;
            MPI_Request s;
            locked([&] { MPI_Isend(io->out.data(), int(io->out.size()), MPI_BYTE, q, tag + 1, c, &s); });
            io->sends.push_back(s);
        }
        if (!late.empty()) fail(ranks_text(late));  // the answers go out eagerly; the gone never take theirs
        auto sent = fresh(options_.timeout);  // every rank is here: the answers go out at once
        for (int spins = 0;; ++spins) {
            int done = 0;
            locked([&] { MPI_Testall(int(io->sends.size()), io->sends.data(), &done, MPI_STATUSES_IGNORE); });
            if (done) break;
            if (sent.expired()) fail("a rank");
            pause(spins);
        }
        return std::move(io->got);
    }

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
    struct alignas(64) Descriptor {  // what a rank passed to a collective call, for validation
        std::atomic<std::uint64_t> call{0};
        std::uint64_t length = 0;
        std::uint32_t type = 0;
        std::int32_t root = 0;
    };
    struct Lane {
        std::uint64_t seq = 0;    // barriers passed on this lane
        std::uint64_t calls = 0;  // collective calls on this lane
        std::uint64_t chunks = 0; // chunks staged (their parity picks the staging buffer)
    };

    static constexpr std::size_t align_up(std::size_t n) { return (n + 63) / 64 * 64; }
    std::size_t control_bytes() const {
        return align_up(sizeof(Control) + std::size_t(lanes_) * (sizeof(Counter) + 2 * sizeof(Descriptor)));
    }

    void open_window() {
        // + 64: MPI aligns a rank's part to 8 bytes only; every process rounds it up to a cache
        // line (the mappings are page-aligned, so each process gets the same offset).
        const std::size_t bytes = 64 + control_bytes() + std::size_t(lanes_) * 2 * align_up(options_.chunk_bytes);
        void* base = nullptr;
        MPI_Info info;
        MPI_Info_create(&info);
        MPI_Info_set(info, "alloc_shared_noncontig", "true");
        const int rc = MPI_Win_allocate_shared(MPI_Aint(bytes), 64, info, comm_, &base, &win_);
        MPI_Info_free(&info);
        STRATA_CHECK(rc == MPI_SUCCESS, DistributedError, "ProcessGroup: MPI_Win_allocate_shared of ", bytes,
                     " bytes failed");
        bases_.resize(std::size_t(size_));
        for (int q = 0; q < size_; ++q) {
            MPI_Aint sz = 0;
            int disp = 0;
            void* p = nullptr;
            MPI_Win_shared_query(win_, q, &sz, &disp, &p);
            const auto addr = reinterpret_cast<std::uintptr_t>(p);
            bases_[std::size_t(q)] = static_cast<char*>(p) + (std::uintptr_t(64) - addr % 64) % 64;
        }
        char* mine = bases_[std::size_t(rank_)];
        ctl_ = new (mine) Control();
        for (int l = 0; l < lanes_; ++l) {
            new (counter_ptr(rank_, l)) Counter();
            new (descriptor_ptr(rank_, l, 0)) Descriptor();
            new (descriptor_ptr(rank_, l, 1)) Descriptor();
        }
        lane_.assign(std::size_t(lanes_), Lane{});
        // Everyone's control blocks are initialized before anyone reads them.
        std::atomic_thread_fence(std::memory_order_seq_cst);
        MPI_Request req;
        MPI_Ibarrier(comm_, &req);
        auto d = fresh(options_.timeout);
        wait_request(req, d, SyncPoint{"set-up", "shared window"}, 0, "some rank");
    }

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
    void arrive_and_wait(int lane, std::uint64_t seq, const SyncPoint& at, std::chrono::milliseconds timeout = {}) {
        if (timeout.count() <= 0) timeout = options_.timeout;
        counter_ptr(rank_, lane)->value.store(seq, std::memory_order_release);
        // Counts the time this process could run: a job suspended as a whole and resumed has
        // not timed out (RunningDeadline).
        RunningDeadline deadline = fresh(timeout);
        bool warned = false;
        int spins = 0;
        for (;;) {
            throw_if_failed(at);
            bool all = true;
            for (int q = 0; q < size_ && all; ++q)
                if (counter_ptr(q, lane)->value.load(std::memory_order_acquire) < seq) all = false;
            if (all) {
                // Everyone arrived, but a peer may have given up on this very barrier before we
                // came: then it is gone, and so is the barrier.
                for (int q = 0; q < size_; ++q)
                    if (q != rank_ && counter_ptr(q, lane)->gave_up.load(std::memory_order_acquire) >= seq) peer_failed(q, at, lane);
                return;
            }
            for (int q = 0; q < size_; ++q)
                if (q != rank_ && control(q).aborted.load(std::memory_order_acquire)) peer_failed(q, at, lane);
            // Spin briefly (a peer on its own core arrives within microseconds), then yield,
            // then sleep: processes may outnumber cores.
            if (++spins < 256) {
#if defined(__x86_64__) || defined(__i386__)
                _mm_pause();
#endif
                continue;
            }
            if (spins < 2048) std::this_thread::yield();
            else std::this_thread::sleep_for(std::chrono::microseconds(deadline.waited() > std::chrono::milliseconds(10) ? 500 : 20));
            const bool expired = deadline.expired();
            const auto waited = deadline.waited();
            if (!warned && options_.stall_warning.count() > 0 && waited > options_.stall_warning) {
                warned = true;
                std::fprintf(stderr, "strata: warning: %s: rank %d has waited %lld ms for %s (timeout %lld ms)\n",
                             where(at, lane).c_str(), name_of(rank_),
                             static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()),
                             missing(lane, seq).c_str(), static_cast<long long>(timeout.count()));
            }
            if (expired) {
                const std::string who = missing(lane, seq) + " did not arrive within " + std::to_string(timeout.count()) + " ms";
                counter_ptr(rank_, lane)->gave_up.store(seq, std::memory_order_release);
                abort("it gave up waiting: " + who);
                throw DistributedError(where(at, lane) + ": " + who);
            }
        }
    }

    [[noreturn]] void peer_failed(int q, const SyncPoint& at, int lane) {
        mark_failed();
        throw_error<DistributedError>(where(at, lane), ": rank ", name_of(q), " of ", named_size(), " failed: ",
                                      std::string(control(q).message));
    }

    // "rank 2 of 3" / "ranks 1, 2 of 4": who has not reached arrival number `seq` on `lane`.
    std::string missing(int lane, std::uint64_t seq) const {
        std::vector<int> late;
        for (int q = 0; q < size_; ++q)
            if (counter_ptr(q, lane)->value.load(std::memory_order_acquire) < seq) late.push_back(q);
        return ranks_text(late);
    }
    std::string ranks_text(const std::vector<int>& ranks) const {
        std::string s = ranks.size() == 1 ? "rank " : "ranks ";
        for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(name_of(ranks[i]));
        return s + " of " + std::to_string(named_size());
    }
    // A stage of a hierarchical group names the ranks of the whole job.
    int name_of(int q) const { return names_.empty() ? q : names_[std::size_t(q)]; }
    int named_size() const { return names_.empty() ? size_ : named_size_; }
    std::string where(const SyncPoint& at, int lane) const {
        return "across processes: " + at.str() + stage_ + (lanes_ > 1 ? " on lane " + std::to_string(lane) : std::string());
    }

    void throw_if_failed(const SyncPoint& at) const {
        if (failed_) throw DistributedError("across processes: " + at.str() + ": the process group failed earlier (a rank timed out or aborted); restart the job");
    }
    void check_lane(int lane, const SyncPoint& at) const {
        if (lane < 0 || lane >= lanes_) throw_error<ValueError>(at.str(), ": lane ", lane, " is outside [0, ", lanes_, ")");
    }

    // Publishes this call's arguments; after the first barrier every rank checks them all.
    void publish(int lane, std::uint64_t length, std::uint32_t type, int root) {
        Lane& ln = lane_state(lane);
        ++ln.calls;
        Descriptor& d = *descriptor_ptr(rank_, lane, int(ln.calls & 1));
        d.length = length;
        d.type = type;
        d.root = root;
        d.call.store(ln.calls, std::memory_order_release);
    }
    void validate(int lane, const SyncPoint& at) {
        const Lane& ln = lane_state(lane);
        const int parity = int(ln.calls & 1);
        const Descriptor& a = *descriptor_ptr(0, lane, parity);
        for (int q = 1; q < size_; ++q) {
            const Descriptor& b = *descriptor_ptr(q, lane, parity);
            if (b.type != a.type || b.root != a.root) {
                mark_failed();
                throw_error<DistributedError>(where(at, lane), ": rank ", q, " called with a different element type or root than rank 0; "
                                              "every rank must make the same collective calls in the same order");
            }
            if (b.length != a.length)
                throw_error<ShapeError>(where(at, lane), ": rank ", q, " passed ", b.length, " elements but rank 0 passed ",
                                        a.length, "; every rank must pass the same length");
        }
    }

    template <Reducible T>
    void shm_all_reduce(int lane, std::span<T> data, ReduceOp op, const SyncPoint& at) {
        Lane& ln = lane_state(lane);
        publish(lane, data.size(), std::is_same_v<T, float> ? 1u : 2u, -1);
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
    // `first_wait`: the deadline of the first arrival (0: the group's timeout); the hierarchical
    // transport's ranks wait longer there for their leader, which may spend up to its own
    // deadlines between hosts first.
    void shm_broadcast(int lane, std::span<T> data, int root, const SyncPoint& at, std::chrono::milliseconds first_wait = {}) {
        Lane& ln = lane_state(lane);
        publish(lane, data.size(), std::is_same_v<T, float> ? 1u : 2u, root);
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

    // ---- MPI transport ---------------------------------------------------------------------------

    // Polls `req` until it completes or the deadline passes (time the process was suspended
    // is not counted: RunningDeadline).
    void wait_request(MPI_Request& req, RunningDeadline& deadline, const SyncPoint& at, int lane, const std::string& who) {
        for (int spins = 0;; ++spins) {
            int done = 0;
            {
                std::unique_lock lock(mpi_mutex_, std::defer_lock);
                if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
                MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            }
            if (done) return;
            if (deadline.expired()) {
                mark_failed();
                throw_error<DistributedError>(where(at, lane), ": ", who, " did not arrive within ", options_.timeout.count(), " ms");
            }
            if (spins > 256) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

    // Every rank reports to rank 0; rank 0 answers "go" when all arrived, or names the missing
    // ranks to those that did. Gives the MPI transport the same error messages as shared memory.
    void arrival_check(int lane, const SyncPoint& at) {
        throw_if_failed(at);
        MPI_Comm c = control_comms_[std::size_t(lane)];
        // The messages' buffers live in the group (and are leaked with it when it fails): a
        // receive still posted when this rank gives up must not write into a dead stack frame.
        ControlBuffers& cb = control_[std::size_t(lane)];
        const std::uint64_t seq = ++seq_[std::size_t(lane)];
        RunningDeadline deadline = fresh(options_.timeout);
        auto locked = [&](auto&& f) {
            std::unique_lock lock(mpi_mutex_, std::defer_lock);
            if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
            f();
        };
        if (rank_ != 0) {
            cb.mine = seq;
            cb.answer = 0;
            MPI_Request send, recv;
            locked([&] {
                MPI_Isend(&cb.mine, 1, MPI_UINT64_T, 0, 1, c, &send);
                MPI_Irecv(&cb.answer, 1, MPI_INT64_T, 0, 2, c, &recv);
            });
            // Rank 0 answers at its own deadline at the latest: wait longer than that before
            // naming rank 0 itself.
            RunningDeadline root_deadline = fresh(2 * options_.timeout);
            const std::string root = "rank " + std::to_string(name_of(0)) + " of " + std::to_string(named_size());
            wait_request(recv, root_deadline, at, lane, root);
            wait_request(send, root_deadline, at, lane, root);
            if (cb.answer > 0) {  // the number of missing ranks; their ranks follow
                cb.late_in.assign(std::size_t(cb.answer), 0);
                MPI_Request r2;
                locked([&] { MPI_Irecv(cb.late_in.data(), int(cb.answer), MPI_INT, 0, 3, c, &r2); });
                wait_request(r2, root_deadline, at, lane, root);
                mark_failed();
                throw_error<DistributedError>(where(at, lane), ": ", ranks_text(cb.late_in), " did not arrive within ",
                                              options_.timeout.count(), " ms");
            }
            return;
        }
        cb.got.assign(std::size_t(size_), 0);
        std::vector<MPI_Request> reqs(std::size_t(size_), MPI_REQUEST_NULL);
        locked([&] {
            for (int q = 1; q < size_; ++q) MPI_Irecv(&cb.got[std::size_t(q)], 1, MPI_UINT64_T, q, 1, c, &reqs[std::size_t(q)]);
        });
        std::vector<int>& late = cb.late;
        bool warned = false;
        for (int spins = 0;; ++spins) {
            late.clear();
            locked([&] {
                for (int q = 1; q < size_; ++q) {
                    int done = reqs[std::size_t(q)] == MPI_REQUEST_NULL;
                    if (!done) MPI_Test(&reqs[std::size_t(q)], &done, MPI_STATUS_IGNORE);
                    if (!done) late.push_back(q);
                }
            });
            if (late.empty()) break;
            const bool expired = deadline.expired();
            const auto waited = deadline.waited();
            if (!warned && options_.stall_warning.count() > 0 && waited > options_.stall_warning) {
                warned = true;
                std::fprintf(stderr, "strata: warning: %s: rank 0 has waited %lld ms for %s (timeout %lld ms)\n",
                             where(at, lane).c_str(),
                             static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()),
                             ranks_text(late).c_str(), static_cast<long long>(options_.timeout.count()));
            }
            if (expired) break;
            if (spins > 256) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        cb.answer = std::int64_t(late.size());
        std::vector<MPI_Request> sends;
        for (int q = 1; q < size_; ++q) {
            if (std::find(late.begin(), late.end(), q) != late.end()) continue;
            MPI_Request s1 = MPI_REQUEST_NULL, s2 = MPI_REQUEST_NULL;
            locked([&] {
                MPI_Isend(&cb.answer, 1, MPI_INT64_T, q, 2, c, &s1);
                if (cb.answer > 0) MPI_Isend(late.data(), int(late.size()), MPI_INT, q, 3, c, &s2);
            });
            sends.push_back(s1);
            if (s2 != MPI_REQUEST_NULL) sends.push_back(s2);
        }
        if (!late.empty()) {
            mark_failed();
            // The answers go out eagerly (a few bytes); ranks that are gone never take theirs.
            throw_error<DistributedError>(where(at, lane), ": ", ranks_text(late), " did not arrive within ",
                                          options_.timeout.count(), " ms");
        }
        RunningDeadline sent = fresh(options_.timeout);
        for (auto& s : sends) wait_request(s, sent, at, lane, "a rank");
    }

    template <Reducible T>
    void mpi_all_reduce(int lane, std::span<T> data, ReduceOp op, const SyncPoint& at) {
        arrival_check(lane, at);
        MPI_Request req;
        {
            std::unique_lock lock(mpi_mutex_, std::defer_lock);
            if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
            MPI_Iallreduce(MPI_IN_PLACE, data.data(), int(data.size()), mpi::datatype<T>(), MPI_SUM,
                           lane_comms_[std::size_t(lane)], &req);
        }
        auto d = fresh(options_.timeout);
        wait_request(req, d, at, lane, "some rank (the transfer stopped part-way)");
        if (op == ReduceOp::Mean)
            for (auto& v : data) v /= T(size_);
    }

    template <Reducible T>
    void mpi_broadcast(int lane, std::span<T> data, int root, const SyncPoint& at) {
        arrival_check(lane, at);
        MPI_Request req;
        {
            std::unique_lock lock(mpi_mutex_, std::defer_lock);
            if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
            MPI_Ibcast(data.data(), int(data.size()), mpi::datatype<T>(), root, lane_comms_[std::size_t(lane)], &req);
        }
        auto d = fresh(options_.timeout);
        wait_request(req, d, at, lane, "some rank (the transfer stopped part-way)");
    }

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
        std::uint64_t mine = 0;
        std::int64_t answer = 0;
        std::vector<std::uint64_t> got;
        std::vector<int> late, late_in;
    };
    std::unique_ptr<ControlBuffers[]> control_;
    std::vector<MPI_Comm> lane_comms_, control_comms_;
    std::vector<std::uint64_t> seq_;
    std::mutex mpi_mutex_;
    // host layout and the hierarchical transport's stages
    int fake_hosts_ = 0;
    std::vector<int> host_of_, host_local_;          // per rank: its host, its index there
    std::unique_ptr<ProcessGroup> inner_, outer_;    // this host's ranks; the hosts' leaders (on leaders)
    std::vector<CrossHostStats> cross_;              // per lane
    std::vector<int> names_;                         // a stage's ranks as ranks of the whole job
    int named_size_ = 0;
    std::string stage_;                              // where(): which stage of a hierarchical group
};

}  // namespace strata::distribute::collective
