#pragma once
/// \file strata/distribute/collective/impl/process_group.ipp
/// The non-template definitions behind strata/distribute/collective/process_group.hpp (the
/// mpi:: helpers, ProcessGroup): included by it in the header-only mode, compiled once in
/// src/strata_mpi.cpp under STRATA_SEPARATE_COMPILATION_MPI (with the member templates for float
/// and double).

#include "strata/distribute/collective/process_group.hpp"
#include "strata/distribute/launcher.hpp"
#include "strata/distribute/shard_group.hpp"

namespace strata::distribute::collective {

namespace detail {
// Settings as bytes: every name and value as its length (8 bytes) and its text.
STRATA_MPI_DECL void put_text(std::string& out, std::string_view s) {
    const std::uint64_t n = s.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out.append(s);
}
STRATA_MPI_DECL bool get_text(std::string_view& in, std::string& s) {
    std::uint64_t n = 0;
    if (in.size() < sizeof n) return false;
    std::memcpy(&n, in.data(), sizeof n);
    in.remove_prefix(sizeof n);
    if (in.size() < n) return false;
    s.assign(in.data(), std::size_t(n));
    in.remove_prefix(std::size_t(n));
    return true;
}
STRATA_MPI_DECL std::string encode(const Settings& settings) {
    std::string out;
    for (const auto& [name, value] : settings) {
        put_text(out, name);
        put_text(out, value);
    }
    return out;
}
STRATA_MPI_DECL Settings decode(std::string_view in) {
    Settings out;
    std::string name, value;
    while (!in.empty()) {
        if (!get_text(in, name) || !get_text(in, value))
            throw DistributedError("ProcessGroup: a peer sent settings that do not decode (is every process the same program?)");
        out.emplace_back(name, value);
    }
    return out;
}

// "rank 1" / "ranks 0, 2"; `names`, when not empty, the job's rank of each (ProcessGroup::names_).
STRATA_MPI_DECL std::string rank_list(const std::vector<int>& ranks, const std::vector<int>& names = {}) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i)
        s += (i ? ", " : "") + std::to_string(names.empty() ? ranks[i] : names[std::size_t(ranks[i])]);
    return s;
}

// Every setting whose value is not the same on every rank, with who has what:
// "transport: rank 0 has mpi, rank 1 has shared_memory; batch_size: ranks 0, 2 have 128, rank 1
// has 64". Empty when the ranks agree. A setting a rank does not have reads "(not set)".
STRATA_MPI_DECL std::string disagreements(const std::vector<Settings>& per_rank, const std::vector<int>& job_ranks = {}) {
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
            out += (i ? ", " : "") + rank_list(groups[i].second, job_ranks) + (groups[i].second.size() == 1 ? " has " : " have ") +
                   groups[i].first;
    }
    return out;
}
}  // namespace detail

namespace mpi {

STRATA_MPI_DECL std::atomic<bool>& job_failed() {
    static std::atomic<bool> failed{false};
    return failed;
}

STRATA_MPI_DECL void check_launcher() {
    const LaunchInfo launch = launch_info();
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world == 1 && launch.size > 1)
        throw DistributedError("MPI sees 1 process (MPI_COMM_WORLD has 1 rank), but " + launch.describe() +
                               ": MPI was not initialised through the launcher, so each process would train alone. Expected " +
                               std::to_string(launch.size) + " ranks: under Slurm use srun --mpi=pmix (or pmi2; srun --mpi=list "
                               "shows what this Slurm offers) with an MPI built for it, or mpirun inside the allocation");
}

STRATA_MPI_DECL int ensure_initialized() {
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

STRATA_MPI_DECL std::vector<int> world_ranks(MPI_Comm comm) {
    int n = 0;
    MPI_Comm_size(comm, &n);
    MPI_Group mine, world;
    MPI_Comm_group(comm, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> ranks(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n), 0);
    for (int q = 0; q < n; ++q) ranks[std::size_t(q)] = q;
    MPI_Group_translate_ranks(mine, n, ranks.data(), world, out.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    return out;
}

STRATA_MPI_DECL int world_rank() {
    ensure_initialized();
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

STRATA_MPI_DECL int world_size() {
    ensure_initialized();
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

STRATA_MPI_DECL int local_rank(MPI_Comm comm) {
    ensure_initialized();
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int r = 0;
    MPI_Comm_rank(node, &r);
    MPI_Comm_free(&node);
    return r;
}

STRATA_MPI_DECL int local_size(MPI_Comm comm) {
    ensure_initialized();
    MPI_Comm node;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int n = 1;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n;
}

}  // namespace mpi

// ---- ProcessGroup ----

template <class OnFailure>
std::vector<std::string> ProcessGroup::exchange(MPI_Comm c, int tag, const std::string& mine, const SyncPoint& at,
                                                std::chrono::milliseconds wait, OnFailure failed) {
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
    auto deadline = fresh(wait);
    auto fail = [&](const std::string& who) {
        failed();
        (void)io.release();
        throw_error<DistributedError>(where, ": ", who, " did not arrive within ", wait.count(), " ms",
                                      wait > options_.timeout ? " (the start-up deadline)" : "");
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
        auto root_deadline = fresh(2 * wait);
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
    bool warned = false, past_step_deadline = false;
    for (int spins = 0;; ++spins) {
        late.clear();
        for (int q = 1; q < size_; ++q)
            if (!have[std::size_t(q)] && !(have[std::size_t(q)] = char(take(q, tag, io->got[std::size_t(q)])))) late.push_back(q);
        if (late.empty() || deadline.expired()) break;
        const auto waited = deadline.waited();
        const auto waited_ms = static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count());
        if (!warned && options_.stall_warning.count() > 0 && waited > options_.stall_warning) {
            warned = true;
            std::fprintf(stderr, "strata: warning: %s: rank 0 has waited %lld ms for %s (%s %lld ms)\n", where.c_str(), waited_ms,
                         ranks_text(late).c_str(), wait > options_.timeout ? "start-up deadline" : "timeout",
                         static_cast<long long>(wait.count()));
        }
        // Past the step deadline a set-up wait says why it has not failed yet: the late rank
        // may still be starting, and is named only at the start-up deadline.
        if (!past_step_deadline && wait > options_.timeout && waited > options_.timeout) {
            past_step_deadline = true;
            std::fprintf(stderr, "strata: warning: %s: rank 0 has waited %lld ms for %s, longer than the timeout of %lld ms: "
                                 "still starting, it is waited for until the start-up deadline of %lld ms\n",
                         where.c_str(), waited_ms, ranks_text(late).c_str(), static_cast<long long>(options_.timeout.count()),
                         static_cast<long long>(wait.count()));
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
    auto sent = fresh(wait);  // every rank is here: the answers go out at once
    for (int spins = 0;; ++spins) {
        int done = 0;
        locked([&] { MPI_Testall(int(io->sends.size()), io->sends.data(), &done, MPI_STATUSES_IGNORE); });
        if (done) break;
        if (sent.expired()) fail("a rank");
        pause(spins);
    }
    return std::move(io->got);
}

STRATA_MPI_DECL ProcessGroup::ProcessGroup(MPI_Comm comm, int lanes, ProcessGroupOptions options) : options_(options), lanes_(lanes) {
    STRATA_CHECK(lanes >= 1 && lanes <= 64, ValueError, "ProcessGroup: lanes must be in [1, 64], got ", lanes);
    STRATA_CHECK(options.timeout.count() > 0, ValueError, "ProcessGroup: the timeout must be > 0 ms, got ",
                 options.timeout.count(), " ms");
    STRATA_CHECK(options.chunk_bytes >= 1024, ValueError, "ProcessGroup: chunk_bytes must be >= 1024, got ",
                 options.chunk_bytes);
    STRATA_CHECK(options.startup_timeout.count() >= 0, ValueError,
                 "ProcessGroup: the start-up deadline must be >= 0 ms (0: max(timeout, 30 s)), got ",
                 options.startup_timeout.count(), " ms");
    if (options_.startup_timeout.count() == 0)
        options_.startup_timeout = std::max<std::chrono::milliseconds>(options_.timeout, std::chrono::seconds(30));
    provided_ = mpi::ensure_initialized();
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    // A group over part of the job (a pipeline's stages, a shard's replicas, the tensor-parallel
    // shards of a stage) names its ranks as the job numbers them, "rank 3 of 4", not by their
    // place in the group: the number a user finds in mpirun's output and in the other ranks'
    // messages. (The hierarchical transport's inner groups are named by the group that opens them.)
    int same = MPI_UNEQUAL;
    MPI_Comm_compare(comm, MPI_COMM_WORLD, &same);
    if (same != MPI_IDENT && same != MPI_CONGRUENT) {
        names_ = mpi::world_ranks(comm);
        MPI_Comm_size(MPI_COMM_WORLD, &named_size_);
    }
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
    // A shared-memory window is only made between ranks that share memory (not with a fake
    // layout: every rank is on this machine then).
    if (fake_hosts_ == 0 && size_ > 1 && transport_ != Transport::Mpi) check_hosts_share_memory(comm);
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
        ring_in_.resize(std::size_t(lanes_));
        gatherv_.resize(std::size_t(lanes_));
        control_ = std::make_unique<ControlBuffers[]>(std::size_t(lanes_));
    }
    // Every strategy across processes joins through a ProcessGroup: the first one over the
    // whole job carries the job's stop agreement, so none can forget it (a group of part of the
    // job, a hybrid's copies or a host's ranks, cannot: not every rank is in it).
    job_stop_.group = this;
    if (size_ > 1 && size_ == mpi::world_size()) register_stop_channel(&job_stop_);
}

STRATA_MPI_DECL ProcessGroup::~ProcessGroup() {
    unregister_stop_channel(&job_stop_);
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

STRATA_MPI_DECL CrossHostStats ProcessGroup::cross_host_stats() const {
    CrossHostStats out;
    for (const auto& s : cross_) {
        out.calls += s.calls;
        out.bytes += s.bytes;
        out.seconds += s.seconds;
    }
    return out;
}

STRATA_MPI_DECL void ProcessGroup::agree(const Settings& settings, std::string_view what) {
    const SyncPoint at{"agree", what};
    throw_if_failed(at);
    if (size_ > 1) {
        // A set-up step (the model, the optimizer, the batch): ranks may still be building theirs.
        const auto all = exchange(comm_, agree_tag, detail::encode(settings), at, options_.startup_timeout, [this] { mark_failed(); });
        std::vector<Settings> per_rank;
        for (const auto& bytes : all) per_rank.push_back(detail::decode(bytes));
        const std::string d = detail::disagreements(per_rank, names_);
        if (!d.empty()) throw_error<ValueError>("ProcessGroup: the ranks disagree on ", what, ": ", d);
    }
    // With the job's split layers over processes (tensor_parallel_processes), the processes of a
    // shard group sit in different groups of this kind (each shard's replicas or pipeline), which
    // agree only among themselves: the same settings agree over the shard group too, so that
    // shard pipelines started with other micro-batches or another optimizer are refused at start
    // rather than training apart. Every process makes the same calls, so these pair up; the
    // shard group's own agreement (a ProcessGroup too) does not recurse.
    thread_local bool in_shard_agree = false;
    ShardGroup* shards = job_shard_group();
    if (shards && !in_shard_agree) {
        in_shard_agree = true;
        const std::string across = std::string(what) + " (across the shards of the tensor-parallel group: " + shards->describe() + ")";
        try {
            shards->agree(settings, across);
        } catch (...) {
            in_shard_agree = false;
            throw;
        }
        in_shard_agree = false;
    }
}

STRATA_MPI_DECL void ProcessGroup::agree(std::string_view name, std::string_view value) {
    agree(Settings{{std::string(name), std::string(value)}}, name);
}

STRATA_MPI_DECL void ProcessGroup::all_reduce_counts(int lane, std::span<std::int64_t> data, SyncPoint at) {
    // Counters are exact in double up to 2^53.
    std::vector<double> d(data.begin(), data.end());
    all_reduce(lane, std::span<double>(d), ReduceOp::Sum, at);
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = std::int64_t(d[i]);
}

STRATA_MPI_DECL void ProcessGroup::barrier(int lane, SyncPoint at) {
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
        arrival_check(lane, at, Call{});
    }
}

STRATA_MPI_DECL void ProcessGroup::abort(std::string_view message) noexcept {
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

STRATA_MPI_DECL void ProcessGroup::join(MPI_Comm comm) {
    char host[MPI_MAX_PROCESSOR_NAME] = {};
    int host_len = 0;
    MPI_Get_processor_name(host, &host_len);
    // STRATA_HOST_NAME names this process's host where the machines' own names do not tell
    // them apart (containers that all answer "localhost"); per process, not compared.
    std::string host_name(host, std::size_t(host_len));
    if (const char* n = std::getenv("STRATA_HOST_NAME"); n != nullptr && *n != '\0') host_name = n;
    fake_hosts_ = options_.fake_hosts;
    if (fake_hosts_ < 0) fake_hosts_ = fake_hosts_from_environment();
    std::string expected = options_.expect_hosts;
    if (expected.empty())
        if (const char* e = std::getenv("STRATA_EXPECT_HOSTS"); e != nullptr) expected = e;
    // The launch's layout is the whole job's: a group of part of it (a hybrid's copies, a
    // pipeline's stage, a host's ranks) has its own.
    if (expected == "any" || size_ != mpi::world_size()) expected.clear();
    Settings mine{{"lanes", std::to_string(lanes_)},
                  {"transport", std::string(to_string(options_.transport))},
                  {"timeout_ms", std::to_string(options_.timeout.count())},
                  {"startup_timeout_ms", std::to_string(options_.startup_timeout.count())},
                  {"chunk_bytes", std::to_string(options_.chunk_bytes)},
                  {"ring_min_bytes", std::to_string(options_.ring_min_bytes)},
                  {"fake_hosts (STRATA_FAKE_HOSTS)", fake_hosts_ > 0 ? std::to_string(fake_hosts_) : std::string()},
                  {"expect_hosts (STRATA_EXPECT_HOSTS)", expected}};
    for (const auto& s : options_.settings) mine.push_back(s);
    // The program's (set_job_settings): compared by every group, so that no strategy across
    // processes can join without them.
    for (const auto& s : job_settings()) mine.push_back(s);
    local_rank_ = 0;
    local_size_ = 1;
    host_of_.assign(std::size_t(size_), 0);
    host_local_.assign(std::size_t(size_), 0);
    if (size_ == 1) {
        check_fake_hosts();
        host_names_.assign(1, fake_hosts_ > 0 ? std::string() : host_name);
        check_expected_hosts(expected);
        return;
    }
    std::string bytes = detail::encode(mine);
    detail::put_text(bytes, "");  // the host name last, outside the settings compared
    detail::put_text(bytes, host_name);
    const auto all = exchange(comm, join_tag, bytes, SyncPoint{"set-up", "process group"}, options_.startup_timeout,
                              [] { mpi::job_failed() = true; });
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
                                "replicas); rank ", name_of(rank_), " has ", lanes_, ", the ranks have from ", lo, " to ", hi);
    const std::string d = detail::disagreements(per_rank, names_);
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
    host_names_ = fake_hosts_ > 0 ? std::vector<std::string>(std::size_t(fake_hosts_)) : seen;
    check_expected_hosts(expected);
}

STRATA_MPI_DECL std::string ProcessGroup::host_layout() const {
    const int hosts = host_count();
    std::string out = std::to_string(hosts) + (hosts == 1 ? " host" : " hosts") +
                      (fake_hosts_ > 0 ? " (STRATA_FAKE_HOSTS)" : "") + ":";
    for (int h = 0; h < hosts; ++h) {
        std::vector<int> ranks;
        for (int q = 0; q < size_; ++q)
            if (host_of_[std::size_t(q)] == h) ranks.push_back(q);
        const std::string name = std::size_t(h) < host_names_.size() ? host_names_[std::size_t(h)] : std::string();
        // (Appended piece by piece: g++ 12 warns falsely about `"x" + std::string`, -Wrestrict.)
        out.append(h == 0 ? " " : ", ");
        if (name.empty()) out.append("host ").append(std::to_string(h));
        else out.append("'").append(name).append("'");
        out.append(ranks.size() == 1 ? " rank " : " ranks ");
        // Runs of consecutive ranks as first-last: "0-3", "0,2", "0-1,4".
        for (std::size_t i = 0; i < ranks.size();) {
            std::size_t j = i;
            while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
            if (i > 0) out.append(",");
            out.append(std::to_string(ranks[i]));
            if (j > i) out.append("-").append(std::to_string(ranks[j]));
            i = j + 1;
        }
    }
    return out;
}

STRATA_MPI_DECL void ProcessGroup::check_expected_hosts(std::string_view expected) const {
    if (expected.empty()) return;
    // "H" or "HxP", decimal digits alone (one parser, as for STRATA_FAKE_HOSTS).
    auto number = [](std::string_view t, long& n) {
        n = 0;
        if (t.empty() || t.size() > 7) return false;
        for (char c : t) {
            if (c < '0' || c > '9') return false;
            n = n * 10 + (c - '0');
        }
        return n >= 1;
    };
    const std::size_t x = expected.find('x');
    long want_hosts = 0, want_per_host = 0;
    const bool ok = number(expected.substr(0, x), want_hosts) &&
                    (x == std::string_view::npos || number(expected.substr(x + 1), want_per_host));
    if (!ok)
        throw_error<ValueError>("ProcessGroup: STRATA_EXPECT_HOSTS / expect_hosts='", expected,
                                "': expected H (hosts) or HxP (H hosts of P ranks each) in decimal digits, e.g. 2x4");
    const int hosts = host_count();
    bool match = hosts == want_hosts;
    for (int h = 0; match && want_per_host > 0 && h < hosts; ++h) match = std::count(host_of_.begin(), host_of_.end(), h) == want_per_host;
    if (!match)
        throw_error<ValueError>("ProcessGroup: the job was expected on ", want_hosts, want_hosts == 1 ? " host" : " hosts",
                                want_per_host > 0 ? " of " + std::to_string(want_per_host) + (want_per_host == 1 ? " rank" : " ranks") + " each"
                                                  : std::string(),
                                " (STRATA_EXPECT_HOSTS / expect_hosts=", expected, "); found ", host_layout(),
                                ". Hosts are told apart by MPI_Get_processor_name (or STRATA_HOST_NAME): check the "
                                "launcher's host list and mapping (mpirun --hostfile/--map-by, srun --ntasks-per-node)");
}

STRATA_MPI_DECL void ProcessGroup::check_hosts_share_memory(MPI_Comm comm) const {
    // Which ranks share memory with this one, as MPI sees it; every rank learns every rank's
    // answer (the lowest rank of its shared-memory group), so all refuse alike.
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Group node_group, comm_group;
    MPI_Comm_group(node, &node_group);
    MPI_Comm_group(comm, &comm_group);
    std::vector<int> local(static_cast<std::size_t>(node_size)), in_comm(static_cast<std::size_t>(node_size));
    for (int i = 0; i < node_size; ++i) local[std::size_t(i)] = i;
    MPI_Group_translate_ranks(node_group, node_size, local.data(), comm_group, in_comm.data());
    MPI_Group_free(&node_group);
    MPI_Group_free(&comm_group);
    MPI_Comm_free(&node);
    int mine = *std::min_element(in_comm.begin(), in_comm.end());
    std::vector<int> domain(static_cast<std::size_t>(size_));
    MPI_Allgather(&mine, 1, MPI_INT, domain.data(), 1, MPI_INT, comm);
    for (int p = 0; p < size_; ++p)
        for (int q = p + 1; q < size_; ++q)
            if (host_of_[std::size_t(p)] == host_of_[std::size_t(q)] && domain[std::size_t(p)] != domain[std::size_t(q)]) {
                std::string machines;
                std::vector<int> heads(domain);
                std::sort(heads.begin(), heads.end());
                heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
                for (int d : heads) {
                    if (!machines.empty()) machines.append(" | ");
                    bool first = true;
                    for (int r = 0; r < size_; ++r)
                        if (domain[std::size_t(r)] == d) {
                            if (!first) machines.append(",");
                            machines.append(std::to_string(r));
                            first = false;
                        }
                }
                const std::string name = host_names_[std::size_t(host_of_[std::size_t(p)])];
                throw_error<ValueError>(
                    "ProcessGroup: ranks ", p, " and ", q, " name their host '", name,
                    "' (MPI_Get_processor_name, or STRATA_HOST_NAME) but do not share memory (MPI_COMM_TYPE_SHARED): "
                    "two machines answer to one name, and the ", to_string(transport_),
                    " transport would put a shared-memory window across them. The layout found: ", host_layout(),
                    "; sharing memory: ranks ", machines,
                    ". Give each machine its own name (its hostname, or STRATA_HOST_NAME per machine), or use "
                    "Transport::Mpi");
            }
}

STRATA_MPI_DECL int ProcessGroup::fake_hosts_from_environment() {
    const char* v = std::getenv("STRATA_FAKE_HOSTS");
    if (v == nullptr || *v == '\0') return 0;
    // Digits only: strtol took leading blanks and a sign (" 2" was 2) but refused trailing ones
    // ("2 "); a value a script quoted carelessly is refused either way, never half-read.
    long n = 0;
    const char* p = v;
    for (; *p >= '0' && *p <= '9' && n <= (1 << 20); ++p) n = n * 10 + (*p - '0');
    if (*p != '\0' || n < 1 || n > (1 << 20))
        throw_error<ValueError>("ProcessGroup: STRATA_FAKE_HOSTS='", v, "': expected a number of hosts in decimal digits alone, "
                                "from 1 to ", 1 << 20, " (or unset)");
    return int(n);
}

STRATA_MPI_DECL void ProcessGroup::check_fake_hosts() const {
    if (fake_hosts_ > 0 && size_ % fake_hosts_ != 0)
        throw_error<ValueError>("ProcessGroup: STRATA_FAKE_HOSTS=", fake_hosts_, " hosts must divide the ", size_,
                                " ranks evenly (expected a divisor of ", size_, ", found ", fake_hosts_, ")");
}

STRATA_MPI_DECL int ProcessGroup::host_count() const {
    return host_of_.empty() ? 1 : 1 + *std::max_element(host_of_.begin(), host_of_.end());
}

STRATA_MPI_DECL void ProcessGroup::open_hierarchy() {
    const int h = host_index();
    MPI_Comm host_comm = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
    MPI_Comm_split(comm_, h, rank_, &host_comm);
    MPI_Comm_split(comm_, host_rank() == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders);
    ProcessGroupOptions o = options_;
    o.settings.clear();
    o.fake_hosts = 0;
    o.expect_hosts = "any";  // checked by this group, over the whole job
    o.transport = Transport::SharedMemory;
    std::vector<int> members, heads;
    for (int q = 0; q < size_; ++q) {
        if (host_of_[std::size_t(q)] == h) members.push_back(q);
        if (host_local_[std::size_t(q)] == 0) heads.push_back(q);
    }
    // Named as this group names its ranks (the job's numbers).
    for (auto& q : members) q = name_of(q);
    for (auto& q : heads) q = name_of(q);
    inner_.reset(new ProcessGroup(host_comm, lanes_, o));
    inner_->names_ = members;
    inner_->named_size_ = named_size();
    inner_->stage_ = " inside host " + std::to_string(h);
    if (leaders != MPI_COMM_NULL) {
        o.transport = Transport::Mpi;
        outer_.reset(new ProcessGroup(leaders, lanes_, o));
        outer_->names_ = heads;
        outer_->named_size_ = named_size();
        outer_->stage_ = " between hosts (their leaders)";
        MPI_Comm_free(&leaders);
    }
    MPI_Comm_free(&host_comm);
    cross_.assign(std::size_t(lanes_), CrossHostStats{});
    hier_scratch_.resize(std::size_t(lanes_));
    hier_plan_.resize(std::size_t(lanes_));
}

STRATA_MPI_DECL MPI_Comm ProcessGroup::dup(MPI_Comm c, const SyncPoint& at) {
    MPI_Comm out = MPI_COMM_NULL;
    MPI_Request req;
    MPI_Comm_idup(c, &out, &req);
    auto d = fresh(options_.startup_timeout);  // part of the set-up: every rank joined a moment ago
    wait_request(req, d, at, 0, "some rank", options_.startup_timeout);
    return out;
}


STRATA_MPI_DECL void ProcessGroup::open_window() {
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
    auto d = fresh(options_.startup_timeout);
    wait_request(req, d, SyncPoint{"set-up", "shared window"}, 0, "some rank", options_.startup_timeout);
}

STRATA_MPI_DECL void ProcessGroup::arrive_and_wait(int lane, std::uint64_t seq, const SyncPoint& at, std::chrono::milliseconds timeout) {
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
        // MPI moves a large message only inside its sender's MPI calls (the TCP transport's
        // rendezvous; no progress thread), and this wait makes none: a message this process
        // sent just before (a pipeline stage's activations, through the Mailbox) would wait
        // for it, and so would its receiver, whom this wait may be waiting for. Found across
        // emulated hosts: stage 0's shard in the stop request's shared-memory stage, stage 1's
        // shard waiting for the rest of its activations, its partner for it, stage 0's other
        // shard for that partner — until the timeout.
        if (spins >= 2048 || (spins & 63) == 0) progress_mpi();
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

STRATA_MPI_DECL void ProcessGroup::progress_mpi() {
    if (mpi::job_failed().load()) return;  // a rank is gone: MPI is left alone
    std::unique_lock lock(mpi_mutex_, std::defer_lock);
    if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
}

STRATA_MPI_DECL void ProcessGroup::peer_failed(int q, const SyncPoint& at, int lane) {
    mark_failed();
    throw_error<DistributedError>(where(at, lane), ": rank ", name_of(q), " of ", named_size(), " failed: ",
                                  std::string(control(q).message));
}

STRATA_MPI_DECL std::string ProcessGroup::missing(int lane, std::uint64_t seq) const {
    std::vector<int> late;
    for (int q = 0; q < size_; ++q)
        if (counter_ptr(q, lane)->value.load(std::memory_order_acquire) < seq) late.push_back(q);
    return ranks_text(late);
}

STRATA_MPI_DECL std::string ProcessGroup::ranks_text(const std::vector<int>& ranks) const {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(name_of(ranks[i]));
    return s + " of " + std::to_string(named_size());
}

STRATA_MPI_DECL std::string ProcessGroup::where(const SyncPoint& at, int lane) const {
    return "across processes: " + at.str() + stage_ + (lanes_ > 1 ? " on lane " + std::to_string(lane) : std::string());
}

STRATA_MPI_DECL void ProcessGroup::throw_if_failed(const SyncPoint& at) const {
    if (failed_) throw DistributedError("across processes: " + at.str() + ": the process group failed earlier (a rank timed out or aborted); restart the job");
}

STRATA_MPI_DECL void ProcessGroup::check_lane(int lane, const SyncPoint& at) const {
    if (lane < 0 || lane >= lanes_) throw_error<ValueError>(at.str(), ": lane ", lane, " is outside [0, ", lanes_, ")");
}

STRATA_MPI_DECL void ProcessGroup::publish(int lane, const Call& call) {
    Lane& ln = lane_state(lane);
    ++ln.calls;
    Descriptor& d = *descriptor_ptr(rank_, lane, int(ln.calls & 1));
    d.what = call;
    d.call.store(ln.calls, std::memory_order_release);
}

STRATA_MPI_DECL std::string ProcessGroup::describe(const Call& c) {
    if (c.root == barrier_root) return "barrier";
    const std::string of = c.type == 1 ? " of float" : c.type == 2 ? " of double" : "";
    if (c.root == reduce_root) return "all_reduce" + of;
    if (c.root == gather_root) return "all_gather" + of;
    return "broadcast" + of + " from rank " + std::to_string(c.root);
}

STRATA_MPI_DECL void ProcessGroup::refuse_mismatch(int lane, const SyncPoint& at, int q, const Call& a, const Call& b) {
    if (b.type != a.type || b.root != a.root) {
        mark_failed();
        throw_error<DistributedError>(where(at, lane), ": rank ", name_of(q), " called ", describe(b), " where rank ", name_of(0),
                                      " called ", describe(a), "; every rank must make the same collective calls in the same order");
    }
    if (b.length != a.length)
        throw_error<ShapeError>(where(at, lane), ": rank ", name_of(q), " passed ", b.length, " elements but rank ", name_of(0),
                                " passed ", a.length, "; every rank must pass the same length");
    if (b.parts != a.parts)
        throw_error<ShapeError>(where(at, lane), ": rank ", name_of(q), " splits the ", a.length, " elements into other parts than rank ",
                                name_of(0), "; every rank must pass the same part sizes");
}

STRATA_MPI_DECL void ProcessGroup::validate(int lane, const SyncPoint& at) {
    const Lane& ln = lane_state(lane);
    const int parity = int(ln.calls & 1);
    const Call& a = descriptor_ptr(0, lane, parity)->what;
    for (int q = 1; q < size_; ++q) refuse_mismatch(lane, at, q, a, descriptor_ptr(q, lane, parity)->what);
}

STRATA_MPI_DECL void ProcessGroup::wait_request(MPI_Request& req, RunningDeadline& deadline, const SyncPoint& at, int lane,
                                                const std::string& who, std::chrono::milliseconds shown) {
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
            throw_error<DistributedError>(where(at, lane), ": ", who, " did not arrive within ",
                                          (shown.count() > 0 ? shown : options_.timeout).count(), " ms");
        }
        if (spins > 256) {
            answer_probes(lane);
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
}

STRATA_MPI_DECL void ProcessGroup::wait_transfer(MPI_Request& req, int lane, const SyncPoint& at) {
    wait_transfers(std::span<MPI_Request>(&req, 1), lane, at);
}

STRATA_MPI_DECL void ProcessGroup::wait_transfers(std::span<MPI_Request> reqs, int lane, const SyncPoint& at) {
    RunningDeadline deadline = fresh(options_.timeout);
    for (int spins = 0;; ++spins) {
        int done = 0;
        {
            std::unique_lock lock(mpi_mutex_, std::defer_lock);
            if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
            MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
        }
        if (done) return;
        if (deadline.expired()) break;
        if (spins > 256) {
            answer_probes(lane);
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
    const std::vector<int> silent = silent_ranks(lane);
    mark_failed();
    if (silent.empty())
        throw_error<DistributedError>(where(at, lane), ": some rank did not arrive within ", options_.timeout.count(),
                                      " ms (the transfer stopped part-way, and every rank says it is still waiting)");
    throw_error<DistributedError>(where(at, lane), ": ", ranks_text(silent), " did not arrive within ", options_.timeout.count(),
                                  " ms (the transfer stopped part-way, and nothing has come from ",
                                  silent.size() == 1 ? "it" : "them", " since)");
}

STRATA_MPI_DECL std::vector<int> ProcessGroup::silent_ranks(int lane) {
    MPI_Comm c = control_comms_[std::size_t(lane)];
    // The buffers live in the group: requests still posted when this returns (to a rank that
    // is gone) are left with the failed group, never pointing into a dead stack frame.
    ControlBuffers& cb = control_[std::size_t(lane)];
    answer_probes(lane);  // a rank whose word came while this one was busy has been heard from
    if (cb.heard.empty()) cb.heard.assign(std::size_t(size_), 0);
    cb.stuck = seq_[std::size_t(lane)];
    cb.stuck_in.assign(std::size_t(size_), 0);
    std::vector<MPI_Request> recvs(std::size_t(size_), MPI_REQUEST_NULL);
    {
        std::unique_lock lock(mpi_mutex_, std::defer_lock);
        if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
        for (int q = 0; q < size_; ++q) {
            if (q == rank_) continue;
            MPI_Request send;
            MPI_Isend(&cb.stuck, 1, MPI_UINT64_T, q, 4, c, &send);
            MPI_Request_free(&send);  // a few bytes, sent eagerly; a rank that is gone never takes them
            MPI_Irecv(&cb.stuck_in[std::size_t(q)], 1, MPI_UINT64_T, q, 4, c, &recvs[std::size_t(q)]);
        }
    }
    // The others' deadlines started within moments of this one's (they posted the same
    // transfer after the same arrival check): half the timeout, at least 100 ms and at most
    // 5 s, is ample for theirs to pass and their word to come.
    const auto window = std::clamp(options_.timeout / 2, std::chrono::milliseconds(100), std::chrono::milliseconds(5000));
    RunningDeadline deadline = fresh(window);
    std::vector<int> silent;
    for (int spins = 0;; ++spins) {
        silent.clear();
        {
            std::unique_lock lock(mpi_mutex_, std::defer_lock);
            if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
            for (int q = 0; q < size_; ++q) {
                if (q == rank_) continue;
                // Its word came to answer_probes (it asked first), or its answer came here.
                int done = recvs[std::size_t(q)] == MPI_REQUEST_NULL || cb.heard[std::size_t(q)] != 0;
                if (!done) MPI_Test(&recvs[std::size_t(q)], &done, MPI_STATUS_IGNORE);
                if (!done) silent.push_back(q);
            }
        }
        if (silent.empty() || deadline.expired()) return silent;
        if (spins > 256) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

STRATA_MPI_DECL void ProcessGroup::answer_probes(int lane) {
    if (!control_ || std::size_t(lane) >= control_comms_.size()) return;  // not set up yet
    MPI_Comm c = control_comms_[std::size_t(lane)];
    ControlBuffers& cb = control_[std::size_t(lane)];
    std::unique_lock lock(mpi_mutex_, std::defer_lock);
    if (provided_ < MPI_THREAD_MULTIPLE) lock.lock();
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, 4, c, &flag, &st);
        if (!flag) return;
        // One word, already here: the receive completes at once.
        MPI_Recv(&cb.probe_in, 1, MPI_UINT64_T, st.MPI_SOURCE, 4, c, MPI_STATUS_IGNORE);
        if (cb.heard.empty()) cb.heard.assign(std::size_t(size_), 0);
        cb.heard[std::size_t(st.MPI_SOURCE)] = std::max<std::uint64_t>(cb.probe_in, 1);
        cb.reply = seq_[std::size_t(lane)];
        MPI_Request send;
        MPI_Isend(&cb.reply, 1, MPI_UINT64_T, st.MPI_SOURCE, 4, c, &send);
        MPI_Request_free(&send);  // a few bytes, sent eagerly (its buffer lives with the group)
    }
}

STRATA_MPI_DECL void ProcessGroup::arrival_check(int lane, const SyncPoint& at, const Call& call) {
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
    constexpr int word = ControlBuffers::word, answer_words = ControlBuffers::answer_words;
    auto pack = [](std::uint64_t* w, std::uint64_t n, const Call& k) {
        w[0] = n;
        w[1] = k.length;
        w[2] = k.type;
        w[3] = std::uint64_t(std::int64_t(k.root));
        w[4] = k.parts;
    };
    auto unpack = [](const auto* w) {
        return Call{std::uint64_t(w[1]), std::uint32_t(w[2]), std::int32_t(std::int64_t(w[3])), std::uint64_t(w[4])};
    };
    if (rank_ != 0) {
        pack(cb.mine, seq, call);
        std::fill(std::begin(cb.answer), std::end(cb.answer), 0);
        MPI_Request send, recv;
        locked([&] {
            MPI_Isend(cb.mine, word, MPI_UINT64_T, 0, 1, c, &send);
            MPI_Irecv(cb.answer, answer_words, MPI_INT64_T, 0, 2, c, &recv);
        });
        // Rank 0 answers at its own deadline at the latest, and this rank waits twice that.
        // But rank 0 may have come to this collective well after this rank did (a slower step
        // on a loaded machine): before naming it, ask whether it lives (silent_ranks; it answers
        // from its own wait), and give a rank 0 that does up to two more timeouts to answer. A
        // fresh clone's suite once named a live rank 0 here ("rank 0 of 3 did not arrive")
        // while rank 0 was still waiting out the stopped rank.
        RunningDeadline root_deadline = fresh(2 * options_.timeout);
        const std::string root = "rank " + std::to_string(name_of(0)) + " of " + std::to_string(named_size());
        auto wait_root = [&](MPI_Request& r) {
            for (int more = 0;; ++more) {
                for (int spins = 0;; ++spins) {
                    int done = 0;
                    locked([&] { MPI_Test(&r, &done, MPI_STATUS_IGNORE); });
                    if (done) return;
                    if (root_deadline.expired()) break;
                    if (spins > 256) {
                        answer_probes(lane);
                        std::this_thread::sleep_for(std::chrono::microseconds(50));
                    }
                }
                if (more < 2) {
                    const std::vector<int> silent = silent_ranks(lane);
                    if (std::find(silent.begin(), silent.end(), 0) == silent.end()) {
                        root_deadline = fresh(options_.timeout);
                        continue;
                    }
                }
                mark_failed();
                throw_error<DistributedError>(where(at, lane), ": ", root, " did not arrive within ", options_.timeout.count(), " ms");
            }
        };
        wait_root(recv);
        wait_root(send);
        if (cb.answer[0] < 0)  // rank answer[1]'s call differs from rank 0's: both follow
            refuse_mismatch(lane, at, int(cb.answer[1]), unpack(cb.answer + 1), unpack(cb.answer + 5));
        if (cb.answer[0] > 0) {  // the number of missing ranks; their ranks follow
            cb.late_in.assign(std::size_t(cb.answer[0]), 0);
            MPI_Request r2;
            locked([&] { MPI_Irecv(cb.late_in.data(), int(cb.answer[0]), MPI_INT, 0, 3, c, &r2); });
            wait_root(r2);
            mark_failed();
            throw_error<DistributedError>(where(at, lane), ": ", ranks_text(cb.late_in), " did not arrive within ",
                                          options_.timeout.count(), " ms");
        }
        return;
    }
    cb.got.assign(std::size_t(size_) * word, 0);
    std::vector<MPI_Request> reqs(std::size_t(size_), MPI_REQUEST_NULL);
    locked([&] {
        for (int q = 1; q < size_; ++q)
            MPI_Irecv(cb.got.data() + std::size_t(q) * word, word, MPI_UINT64_T, q, 1, c, &reqs[std::size_t(q)]);
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
        if (spins > 256) {
            answer_probes(lane);
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
    // Of the late ranks, those alive and waiting in an earlier collective (stuck behind the one
    // that stopped: it finished a transfer for this rank, not for them) answer a probe; those
    // that do not are the missing ones. Named: the missing; the others said apart.
    std::vector<int> behind;
    if (!late.empty()) {
        const std::vector<int> silent = silent_ranks(lane);
        std::vector<int> gone;
        for (int q : late) (std::find(silent.begin(), silent.end(), q) != silent.end() ? gone : behind).push_back(q);
        if (!gone.empty()) late = gone;
        else behind.clear();
    }
    std::fill(std::begin(cb.answer), std::end(cb.answer), 0);
    cb.answer[0] = std::int64_t(late.size());
    int differs = 0;  // the first rank whose call is not rank 0's
    if (late.empty()) {
        for (int q = 1; q < size_ && differs == 0; ++q) {
            const Call k = unpack(cb.got.data() + std::size_t(q) * word);
            if (k.type != call.type || k.root != call.root || k.length != call.length || k.parts != call.parts) differs = q;
        }
        if (differs != 0) {
            std::uint64_t w[word];
            pack(w, 0, call);
            cb.answer[0] = -1;
            cb.answer[1] = differs;
            for (int i = 1; i < word; ++i) cb.answer[1 + i] = std::int64_t(w[i]);
            const std::uint64_t* theirs = cb.got.data() + std::size_t(differs) * word;
            for (int i = 1; i < word; ++i) cb.answer[5 + i] = std::int64_t(theirs[i]);
        }
    }
    std::vector<MPI_Request> sends;
    for (int q = 1; q < size_; ++q) {
        if (std::find(late.begin(), late.end(), q) != late.end() || std::find(behind.begin(), behind.end(), q) != behind.end())
            continue;
        MPI_Request s1 = MPI_REQUEST_NULL, s2 = MPI_REQUEST_NULL;
        locked([&] {
            MPI_Isend(cb.answer, answer_words, MPI_INT64_T, q, 2, c, &s1);
            if (cb.answer[0] > 0) MPI_Isend(late.data(), int(late.size()), MPI_INT, q, 3, c, &s2);
        });
        sends.push_back(s1);
        if (s2 != MPI_REQUEST_NULL) sends.push_back(s2);
    }
    if (!late.empty()) {
        mark_failed();
        // The answers go out eagerly (a few bytes); ranks that are gone never take theirs.
        if (!behind.empty())
            throw_error<DistributedError>(where(at, lane), ": ", ranks_text(late), " did not arrive within ",
                                          options_.timeout.count(), " ms (", ranks_text(behind),
                                          behind.size() == 1 ? " answered: it is" : " answered: they are",
                                          " still in an earlier collective, waiting)");
        throw_error<DistributedError>(where(at, lane), ": ", ranks_text(late), " did not arrive within ",
                                      options_.timeout.count(), " ms");
    }
    RunningDeadline sent = fresh(options_.timeout);
    for (auto& s : sends) wait_request(s, sent, at, lane, "a rank");
    if (differs != 0) refuse_mismatch(lane, at, differs, call, unpack(cb.answer + 5));
}

}  // namespace strata::distribute::collective
