#pragma once
/// \file strata/distribute/path/parameter_server.hpp
/// The gradient path of `ParameterServer<P, Sync>`: shards on servers, workers that pull
/// version-stamped copies and push gradients, and a coordinator (the caller's thread) that
/// admits pushes into updates by the sync mode's rule (sync.hpp's table):
///
///   Synchronous   every worker computes on w_j; the update closes when all have pushed.
///   KSync<K>      every worker starts on w_j; the first K close the update, the rest are
///                 cancelled (between layers of backward) and everyone restarts on w_{j+1}.
///   KBatchSync<K> a worker that pushed starts another mini-batch on w_j at once; the K-th push
///                 closes the update and cancels the unfinished ones.
///   KAsync<K>     a worker that pushed waits; K pushes close the update and the waiting workers
///                 pull w_{j+1}; nobody is cancelled, so later pushes can be stale.
///   KBatchAsync<K> a worker that pushed pulls the current version and goes on; every K pushes
///                 close an update.
///   Asynchronous<B> each push is an update; a worker that has finished c mini-batches starts
///                 its next only while c − min over workers ≤ B (stale synchronous parallel).
///
/// An update applies the mean gradient of its pushes: workers compute with the loss summed over
/// their examples, and each server divides the sum of its inbox by the update's example count.
/// Staleness of a push = updates applied between its pull and its admission.
///
/// An epoch ends when the data runs out (the last, partial update is applied) or when fit's
/// steps_per_epoch updates are done; mini-batches still in flight then are cancelled, so work
/// never straddles an epoch (evaluation and checkpoints see a quiet model).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/stop_signal.hpp"
#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/parameter_server.hpp"
#include "strata/distribute/parameter_server_stats.hpp"
#include "strata/distribute/replica_pool.hpp"

namespace strata::distribute {

namespace detail {
struct Cancelled {};  // thrown by backward's hook to stop a cancelled mini-batch between layers
// Across processes: a worker rank that did not report by the deadline (killed, stopped, gone).
struct WorkerLost : DistributedError {
    using DistributedError::DistributedError;
};

/// What of ParameterServer's path depends on neither the network nor the sync type: the
/// servers and their shards, the workers' copies, the coordinator that admits pushes by the
/// mode's rule (chosen at run time: ParameterServerConfig), the processes' messages. Templated
/// on the place and the element type only; its members are defined out of the class, so that
/// the compiled part's instantiations for the host (`extern template`, below) are the only ones
/// a program uses. GradientPath<ParameterServer<P, Sync>, Net, T> hands it the network's
/// variables and its units of work.
template <class P, class T>
class ParameterServerCore {
public:
    /// A unit of work on one mini-batch (Model's): worker w's batch, its copy of the variables,
    /// its gradient buffer, the loss's denominator, the step, and the hook backward calls
    /// between layers (a cancelled mini-batch stops there).
    template <class Y>
    using Work = FunctionRef<UnitWork(int, const ReplicaBatch<Y>&, const T*, T*, double, std::uint64_t,
                                      FunctionRef<void(std::int64_t, std::int64_t)>)>;
    /// The next mini-batch, or none when the data is exhausted.
    template <class Y>
    using Next = FunctionRef<std::optional<ReplicaBatch<Y>>()>;
    /// After every update, its totals; false: no more updates.
    using OnStep = FunctionRef<bool(const StepTotals&)>;

    /// `infos`: the network's variables (num_params values in all); `model_settings`: what
    /// every process must share of the model (asked across processes only); `init`: writes
    /// the initial values.
    ParameterServerCore(ReplicaRuntime<P>& runtime, const ParameterServerConfig& config, std::int64_t num_params,
                        std::vector<nn::ParamInfo> infos, FunctionRef<collective::Settings()> model_settings,
                        FunctionRef<void(T*)> init);
    ~ParameterServerCore();
    ParameterServerCore(const ParameterServerCore&) = delete;
    ParameterServerCore& operator=(const ParameterServerCore&) = delete;

    int units() const { return num_workers_; }
    /// Across processes only the coordinator (rank 0) prints and writes files.
    bool is_chief() const { return !remote_ || remote_->role() == Role::Coordinator; }
    /// evaluate and predict: `f(w)` on every worker's thread, between epochs only.
    void run_units(FunctionRef<void(int)> f) {
        STRATA_CHECK(!in_epoch_, ValueError,
                     "ParameterServer: evaluate/predict cannot run inside an epoch (the workers are busy training); call "
                     "them between epochs (fit's validation_data does) or after fit");
        runtime_->run_replicas(f);
    }

    void compile(const optim::Optimizer& o);

    /// Every worker pulls the current version (evaluate and predict compute with it).
    void prepare_inference() {
        for (int w = 0; w < num_workers_; ++w) pull(w);
    }
    const T* inference_params(int w) { return workers_[std::size_t(w)].params.data(); }

    /// Runs mini-batches from `next` (each one worker's) until it is exhausted or `on_step`
    /// says stop: updates by the mode's rule, `on_step(StepTotals)` after every update.
    template <class Y>
    void epoch_run(Next<Y> next, std::uint64_t& step, Work<Y> work, OnStep on_step);

    // ---- the schedule -----------------------------------------------------------------------

    /// Updates an epoch over `batches` mini-batches is expected to make (-1: not known ahead).
    std::int64_t expected_updates(std::int64_t batches) const {
        if (batches < 0) return -1;
        if (rule_ == sync::Rule::Synchronous || rule_ == sync::Rule::KSync) return (batches + num_workers_ - 1) / num_workers_;
        else if (rule_ == sync::Rule::KBatchSync) return -1;  // cancelled batches are not known ahead
        else return (batches + k_ - 1) / k_;
    }

    // ---- figures ----------------------------------------------------------------------------

    /// Counts of the last epoch (or train_step), and since the path was built.
    const ParameterServerStats& epoch_stats() const { return epoch_; }
    const ParameterServerStats& stats() const { return total_; }
    /// Called after every update with its record (e.g. to plot error against time).
    void set_update_observer(std::function<void(const UpdateRecord&)> f) { observer_ = std::move(f); }
    /// Clock seconds since the path was built (virtual under Clock::Virtual).
    double clock_seconds() const { return now_; }
    std::int64_t version() const { return version_; }
    /// Across processes: the workers lost so far (killed or stalled past the deadline) under a
    /// mode that goes on without them (every mode but Synchronous), in the order they were lost.
    const std::vector<int>& lost_workers() const { return lost_; }

    std::vector<std::int64_t> staleness_histogram() const { return epoch_.histogram; }

    /// The shard plan: which rows of which variable each server holds.
    const std::vector<ShardRange>& shards() const { return shards_; }

    // ---- variables ----------------------------------------------------------------------------

    std::vector<T> get_weights() const {
        std::vector<T> out(static_cast<std::size_t>(num_params_));
        for (const auto& srv : servers_) gather(srv, srv.params, out);
        return out;
    }
    void set_weights(const std::vector<T>& w) {
        for (auto& srv : servers_) scatter(srv, w, srv.params);
        ++version_;  // workers holding an older copy pull again
    }
    std::vector<std::pair<std::string, std::vector<T>>> slots() const {
        std::vector<std::pair<std::string, std::vector<T>>> out;
        if (!compiled_) return out;
        for (auto& [name, t] : const_cast<optim::OptimizerState<T, P>&>(servers_[0].opt).slots()) {
            std::vector<T> v(static_cast<std::size_t>(num_params_));
            for (const auto& srv : servers_)
                for (auto& [n2, t2] : const_cast<optim::OptimizerState<T, P>&>(srv.opt).slots())
                    if (n2 == name) gather(srv, t2, v);
            out.emplace_back(name, std::move(v));
        }
        return out;
    }
    bool set_slot(const std::string& name, const std::vector<T>& v) {
        bool found = false;
        for (auto& srv : servers_)
            for (auto& [n, t] : srv.opt.slots())
                if (n == name) {
                    scatter(srv, v, t);
                    found = true;
                }
        return found;
    }
    std::string optimizer_name() const { return compiled_ ? servers_[0].opt.name() : std::string(); }
    std::int64_t iterations() const { return compiled_ ? servers_[0].opt.iterations() : 0; }
    void set_iterations(std::int64_t it) {
        for (auto& srv : servers_) srv.opt.set_iterations(it);
    }
    double learning_rate() const { return compiled_ ? servers_[0].opt.current_learning_rate() : 0.0; }
    void set_learning_rate(double lr) {
        for (auto& srv : servers_) srv.opt.set_learning_rate(lr);
    }
    // No loss scale here: Model refuses precision::MixedFloat16 under ParameterServer (each
    // worker's gradient is applied alone: no global step for every worker to skip together).
    optim::LossScaleState loss_scale_state() const { return compiled_ ? servers_[0].opt.loss_scale_state() : optim::LossScaleState{}; }
    void set_loss_scale_state(const optim::LossScaleState& s) {
        for (auto& srv : servers_) srv.opt.set_loss_scale_state(s);
    }

    void log_placement() {
        if (!place::get_log_device_placement()) return;
        const auto& infos = infos_;
        const auto& devs = config_->server_devices();
        for (const auto& sh : shards_) {
            const auto& p = infos[std::size_t(sh.variable)];
            place::log_placement("variable " + p.name + " " + p.shape.str() + " shard " + std::to_string(sh.shard) + " rows [" +
                                     std::to_string(sh.row_first) + ", " + std::to_string(sh.row_first + sh.row_count) + ")",
                                 devs[std::size_t(sh.server)]);
        }
    }

private:
    // A server: its shards as one compact buffer (shard after shard, in plan order), their
    // optimizer slots, and the inbox of pushes for the open update.
    struct Server {
        std::vector<ShardRange> ranges;
        std::vector<std::int64_t> compact;  // where each range starts in the compact buffers
        std::int64_t size = 0;
        Tensor<T, P> params;
        optim::OptimizerState<T, P> opt;
        std::vector<Tensor<T, P>> inbox;  // messages; reused across updates
        int received = 0;
    };
    struct Worker {
        Tensor<T, P> params, grads;
        std::int64_t version = -1;   // the version its params hold
        std::uint64_t batches = 0;   // mini-batches started (the straggler draws' counter)
    };
    enum class State { Idle, Computing, Waiting, Blocked, Lost };
    struct Job {
        bool pending = false;
        std::uint64_t step = 0, n = 0;
    };
    struct Result {
        bool ready = false, cancelled = false;
        UnitWork work{};
        // What a worker's exception said, taken on the worker's thread: the exception object
        // itself never crosses threads (its reference count lives in libstdc++, which TSan
        // does not see, so a cross-thread release reads as a race).
        bool failed = false;
        bool lost = false;  // across processes: the worker rank did not report by the deadline
        std::string error{};
    };
    template <class Y>
    struct OwnedBatch {
        std::vector<float> x;
        std::vector<Y> y;
        std::vector<float> w;  // sample weights; empty when the data has none
        ReplicaBatch<Y> view() const {
            ReplicaBatch<Y> b;
            b.x = x;
            b.y = y;
            b.w = w;
            b.size = size;
            b.global_size = size;
            b.example_size = example_size;
            b.y_per_example = y_per_example;
            return b;
        }
        std::int64_t size = 0, example_size = 0, y_per_example = 1;
    };

    void plan();

    // Server `srv`'s compact buffer `from` into the flat layout `out` (host).
    void gather(const Server& srv, const Tensor<T, P>& from, std::vector<T>& out) const {
        if (srv.size == 0) return;
        const auto v = to_vector(const_cast<Tensor<T, P>&>(from).view());
        for (std::size_t i = 0; i < srv.ranges.size(); ++i)
            std::copy_n(v.begin() + srv.compact[i], srv.ranges[i].count, out.begin() + srv.ranges[i].first);
    }
    void scatter(const Server& srv, const std::vector<T>& flat, Tensor<T, P>& to) const {
        for (std::size_t i = 0; i < srv.ranges.size(); ++i)
            copy(TensorView<T, place::Host>(const_cast<T*>(flat.data()) + srv.ranges[i].first, Shape{srv.ranges[i].count}),
                 TensorView<T, P>(to.data() + srv.compact[i], Shape{srv.ranges[i].count}));
    }

    // Pull: every server's reply (a copy of its shards at the current version) lands in the
    // worker's own buffer.
    void pull(int w) {
        auto& wk = workers_[std::size_t(w)];
        if (wk.version == version_) return;
        for (auto& srv : servers_)
            for (std::size_t i = 0; i < srv.ranges.size(); ++i)
                copy(TensorView<T, P>(srv.params.data() + srv.compact[i], Shape{srv.ranges[i].count}),
                     TensorView<T, P>(wk.params.data() + srv.ranges[i].first, Shape{srv.ranges[i].count}));
        wk.version = version_;
    }
    // Push: one message per server, a copy of its shards of the worker's gradient.
    void push(int w) {
        auto& wk = workers_[std::size_t(w)];
        for (auto& srv : servers_) {
            if (srv.size == 0) continue;
            if (int(srv.inbox.size()) <= srv.received) srv.inbox.emplace_back(Shape{srv.size});
            auto& msg = srv.inbox[std::size_t(srv.received++)];
            for (std::size_t i = 0; i < srv.ranges.size(); ++i)
                copy(TensorView<T, P>(wk.grads.data() + srv.ranges[i].first, Shape{srv.ranges[i].count}),
                     TensorView<T, P>(msg.data() + srv.compact[i], Shape{srv.ranges[i].count}));
        }
    }



    // The smallest count of finished mini-batches among the workers still there (SSP).
    static std::int64_t slowest(const std::vector<std::int64_t>& completed, const std::vector<State>& state) {
        std::int64_t lo = std::numeric_limits<std::int64_t>::max();
        for (std::size_t i = 0; i < completed.size(); ++i)
            if (state[i] != State::Lost) lo = std::min(lo, completed[i]);
        return lo == std::numeric_limits<std::int64_t>::max() ? 0 : lo;
    }
    // How long the coordinator waits for a worker's result: across processes longer than the
    // proxy's own deadline, so that the proxy names the worker rank first.
    std::chrono::milliseconds coordinator_wait() const { return remote_ ? 2 * timeout() + std::chrono::seconds(1) : timeout(); }

    // ---- across processes (ParameterServerOptions::processes) ------------------------------------
    using Role = ParameterServerProcesses::Role;
    using Received = ParameterServerProcesses::Received;
    // Message kinds.
    static constexpr std::uint32_t kSendParams = 1, kParams = 2, kJob = 3, kDone = 4, kCancel = 5, kCancelled = 6,
                                   kFailed = 7, kPushNow = 8, kDiscard = 9, kAdmit = 10, kPush = 11, kApply = 12, kAck = 13,
                                   kEnd = 14, kState = 15, kAbort = 16;
    [[noreturn]] void coordinator_stopped(const Received& m) {
        remote_->mark_lost(-1);  // the job failed: no MPI_Finalize, which would wait for every rank
        throw DistributedError("ParameterServer: the coordinator stopped the job: " +
                               std::string(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()));
    }
    std::chrono::milliseconds timeout() const { return config_->ps_options().timeout; }
    // How long a server or worker waits for the coordinator's next word: the coordinator itself
    // may wait a timeout for a worker first.
    std::chrono::milliseconds idle_timeout() const { return 10 * timeout(); }

    template <class V>
    static void put(std::vector<std::byte>& out, const V* p, std::size_t n) {
        if (n == 0) return;  // an empty vector's data() may be null
        const auto* b = reinterpret_cast<const std::byte*>(p);
        out.insert(out.end(), b, b + n * sizeof(V));
    }
    template <class V>
    static const std::byte* get(const std::byte* in, V* p, std::size_t n) {
        if (n == 0) return in;
        std::memcpy(static_cast<void*>(p), in, n * sizeof(V));
        return in + n * sizeof(V);
    }

    void apply_inbox(Server& srv, T inv) {
        if (srv.size == 0 || srv.received == 0) return;
        auto acc = srv.inbox[0].view();
        for (int i = 1; i < srv.received; ++i) axpy(T(1), srv.inbox[std::size_t(i)].view(), acc);
        scale(acc, inv, acc);
        srv.opt.apply(srv.params.data(), acc.data());
        srv.received = 0;
    }

    // Coordinator: the decision on a finished mini-batch (push it, or discard it).
    void decide(int w, std::uint32_t kind, std::uint64_t step) { remote_->send(remote_->worker_rank(w), kind, step, {}); }
    void remote_push(int w, std::uint64_t step) {
        decide(w, kPushNow, step);
        const std::int64_t who = w;
        for (int sv = 0; sv < int(servers_.size()); ++sv)
            remote_->send(remote_->server_rank(sv), kAdmit, step, std::as_bytes(std::span<const std::int64_t>(&who, 1)));
    }
    void remote_apply(T inv) {
        for (int sv = 0; sv < int(servers_.size()); ++sv)
            remote_->send(remote_->server_rank(sv), kApply, std::uint64_t(version_), std::as_bytes(std::span<const T>(&inv, 1)));
        for (int sv = 0; sv < int(servers_.size()); ++sv) {
            const auto m = remote_->receive(remote_->server_rank(sv), "ParameterServer: update acknowledgement", coordinator_wait());
            STRATA_CHECK(m.kind == kAck, DistributedError, "ParameterServer: ", remote_->name(m.source), " sent message ", m.kind,
                         " where an acknowledgement was expected");
            std::int64_t stop = 0;
            if (m.payload.size() >= sizeof stop) get(m.payload.data(), &stop, 1);
            take_stop(int(stop));
        }
    }

    // Coordinator, on worker w's proxy thread: the mini-batch computed by worker rank w.
    template <class Y>
    UnitWork remote_work(int w, const OwnedBatch<Y>& ob, const Job& job, std::atomic<bool>& cancel);

    // Worker rank, on the thread of its worker index: the coordinator's jobs until the epoch ends.
    template <class Y>
    void work_epoch(int w, Work<Y> work);

    // Server or worker rank: the coordinator's end of an epoch, with the ranks of the workers
    // lost so far. Every rank must learn them: the servers do not send their state to them, and
    // no rank may call MPI_Finalize at exit, which waits for every rank (a worker that was
    // stopped, then killed while the others were in it, left them waiting there for ever).
    // Its first word is the stop the coordinator decided (the signal, 0: none): every rank's
    // stop_signal() takes it, so each rank's StopOnSignal ends fit after this epoch and the
    // program exits with that signal's status on every rank.
    void epoch_ended(const Received& m) {
        const std::size_t words = m.payload.size() / sizeof(std::int64_t);
        std::int64_t stop = 0;
        if (words > 0) get(m.payload.data(), &stop, 1);
        gone_ranks_.assign(words > 0 ? words - 1 : 0, 0);
        if (!gone_ranks_.empty()) std::memcpy(gone_ranks_.data(), m.payload.data() + sizeof(std::int64_t), gone_ranks_.size() * sizeof(std::int64_t));
        for (auto r : gone_ranks_) remote_->mark_lost(int(r));
        take_stop(int(stop));
    }
    // A stop asked for on another rank (a signal that reached one worker, server or the
    // coordinator alone): the highest signal wins, as in the lockstep strategies' agreement.
    static void take_stop(int signal) {
        int mine = stop_signal().load();
        while (signal > mine && !stop_signal().compare_exchange_weak(mine, signal)) {
        }
    }
    // The stop this rank asks for, sent with its next report (a worker's result, a server's
    // acknowledgement): the parameter server's ranks never meet in lockstep, so the coordinator
    // collects the requests and its epoch's end carries the decision to every rank.
    static std::int64_t stop_request() { return std::int64_t(stop_signal().load()); }

    // Server rank: the coordinator's commands until the epoch ends.
    void serve_epoch();

    // Every rank, after an epoch: each server sends its shards, optimizer slots and iteration
    // count to every other rank, so that every rank's copy of the servers is the same.
    void sync_mirror();

    ReplicaRuntime<P>* runtime_;
    const ParameterServerConfig* config_;
    std::int64_t num_params_;
    std::vector<nn::ParamInfo> infos_;  // the network's variables
    ParameterServerProcesses* remote_;  // across processes: roles and messages; null in one process
    std::vector<int> lost_;                 // across processes: workers lost (their indices)
    std::vector<std::int64_t> gone_ranks_;  // across processes: their ranks, as the last epoch's end said
    sync::Rule rule_;        // the sync mode's admission rule (the type's, or chosen at run time)
    bool lockstep_rounds_;   // Synchronous, KSync, KBatchSync: updates close rounds of dispatches
    int num_workers_;     // W: the workers (lost ones included)
    int k_;               // K of the K modes (0 otherwise)
    int staleness_bound_; // B of Asynchronous<B> (-1: unbounded)
    std::vector<ShardRange> shards_;
    std::vector<Server> servers_;
    std::vector<Worker> workers_;
    std::unique_ptr<ReplicaPool> server_pool_;
    bool compiled_ = false, in_epoch_ = false;
    std::int64_t version_ = 0;
    double now_ = 0;
    ParameterServerStats epoch_, total_;
    std::function<void(const UpdateRecord&)> observer_;

    // Coordinator ↔ worker threads.
    std::mutex mutex_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::vector<Job> jobs_;
    std::vector<Result> results_;
    std::deque<int> fifo_;
    std::vector<std::unique_ptr<std::atomic<bool>>> cancel_;
};

template <class P, class T>
ParameterServerCore<P, T>::ParameterServerCore(ReplicaRuntime<P>& runtime, const ParameterServerConfig& config, std::int64_t num_params,
                                               std::vector<nn::ParamInfo> infos, FunctionRef<collective::Settings()> model_settings,
                                               FunctionRef<void(T*)> init)
    : runtime_(&runtime), config_(&config), num_params_(num_params), infos_(std::move(infos)),
      remote_(config.ps_options().processes.get()), rule_(config.rule()),
      lockstep_rounds_(rule_ == sync::Rule::Synchronous || rule_ == sync::Rule::KSync || rule_ == sync::Rule::KBatchSync),
      num_workers_(runtime.num_replicas_in_sync()), k_(config.k()), staleness_bound_(config.staleness_bound()) {
    plan();
    distribute::detail::check_units_fit_memory("ParameterServer", "workers", num_workers_, 2 * std::uint64_t(num_params_) * sizeof(T),
                                               "a pulled copy of the variables and a gradient");
    workers_.resize(std::size_t(num_workers_));
    runtime_->run_replicas([&](int w) {  // on the worker's thread: its logical device's memory
        workers_[std::size_t(w)].params.resize(Shape{num_params_});
        workers_[std::size_t(w)].grads.resize(Shape{num_params_});
    });
    server_pool_ = std::make_unique<ReplicaPool>(config_->num_servers(), [](int) { set_num_threads(1); }, true);
    server_pool_->run([&](int sv) {
        auto& srv = servers_[std::size_t(sv)];
        srv.params.resize(Shape{srv.size});
    });
    // The initial values, computed once and sent to each server as its shards.
    Tensor<T, P> full(Shape{num_params_});
    init(full.data());
    const auto host = to_vector(full.view());
    if (remote_) {  // every rank computes them from the seed: the same model and the same values
        auto same = model_settings();
        same.emplace_back("initial variables (the seed's)", distribute::detail::fnv1a_hex(host.data(), host.size() * sizeof(T)));
        remote_->agree(same, "the model");
    }
    set_weights(host);
    for (int i = 0; i < num_workers_; ++i) cancel_.push_back(std::make_unique<std::atomic<bool>>(false));
    jobs_.resize(std::size_t(num_workers_));
    results_.resize(std::size_t(num_workers_));
}

template <class P, class T>
ParameterServerCore<P, T>::~ParameterServerCore() = default;

template <class P, class T>
void ParameterServerCore<P, T>::compile(const optim::Optimizer& o) {
    STRATA_CHECK(optim::global_clipnorm_of(o) == 0, ValueError, "ParameterServer: global_clipnorm (", optim::global_clipnorm_of(o),
                 ") needs the norm of the whole model's gradient, and each server updates its shards from its own part; "
                 "train without it, or under Mirrored, CentralStorage or MultiWorkerMirrored");
    if (remote_) remote_->agree({{"optimizer", optim::describe(o)}}, "the optimizer");  // every rank the same one
    server_pool_->run([&](int sv) {
        auto& srv = servers_[std::size_t(sv)];
        // The moving statistics among the server's ranges, at their places in its compact buffer.
        std::vector<optim::MovingAverageRange> moving;
        for (std::size_t i = 0; i < srv.ranges.size(); ++i)
            for (auto m : distribute::detail::moving_ranges(infos_, srv.ranges[i].first, srv.ranges[i].count)) {
                m.first += srv.compact[i];
                moving.push_back(m);
            }
        std::sort(moving.begin(), moving.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        srv.opt = optim::OptimizerState<T, P>(o, srv.size, std::move(moving));
    });
    compiled_ = true;
}

template <class P, class T>
template <class Y>
void ParameterServerCore<P, T>::epoch_run(Next<Y> next, std::uint64_t& step, Work<Y> work, OnStep on_step) {
    STRATA_CHECK(compiled_, ValueError, "ParameterServer: the model is not compiled");
    STRATA_CHECK(!in_epoch_, ValueError, "ParameterServer: fit or train_step called from inside an epoch (a callback)");
    if (remote_ && remote_->role() != Role::Coordinator) {
        // A server or worker rank serves the coordinator's epoch, then takes the state.
        in_epoch_ = true;
        struct Guard {
            bool& flag;
            ~Guard() { flag = false; }
        } g{in_epoch_};
        if (remote_->role() == Role::Server) serve_epoch();
        else runtime_->run_replicas([&](int t) {
                if (t == remote_->index()) work_epoch<Y>(t, work);
            });
        sync_mirror();
        return;
    }
    const auto& opt = config_->ps_options();
    const bool virtual_clock = opt.clock == Clock::Virtual;
    std::vector<OwnedBatch<Y>> owned(static_cast<std::size_t>(num_workers_));
    std::vector<State> state(std::size_t(num_workers_), State::Idle);
    for (int w : lost_) state[std::size_t(w)] = State::Lost;  // lost in an earlier epoch
    std::vector<double> finish(std::size_t(num_workers_), 0.0);
    std::vector<std::int64_t> completed(std::size_t(num_workers_), 0);
    epoch_ = ParameterServerStats{};
    const double epoch_start = now_;
    const auto real_start = std::chrono::steady_clock::now();
    const double real_base = now_;
    bool exhausted = false, stopping = false;
    std::vector<int> deferred;  // virtual clock: restarts held until the instant's other arrivals
    int round_started = 0;
    StepTotals totals;
    int pending = 0;
    std::int64_t pending_max_staleness = 0;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = false;
        fifo_.clear();
        for (auto& r : results_) r = Result{};
        for (auto& j : jobs_) j = Job{};
    }
    in_epoch_ = true;
    struct EpochGuard {
        bool& flag;
        ~EpochGuard() { flag = false; }
    } guard{in_epoch_};

    auto clock_now = [&] {
        if (!virtual_clock) now_ = real_base + std::chrono::duration<double>(std::chrono::steady_clock::now() - real_start).count();
        return now_;
    };
    auto computing = [&] {
        int n = 0;
        for (auto s : state) n += s == State::Computing;
        return n;
    };
    // Jobs are handed to the worker threads by post(). Under the real clock at once; under
    // the virtual clock at most `slots` at a time, soonest virtual finish first: the schedule
    // depends on the drawn times only, so a mini-batch that will be cancelled before it
    // would finish is never computed unless a core would otherwise be idle.
    std::vector<Job> job_of(static_cast<std::size_t>(num_workers_));
    std::vector<char> posted(std::size_t(num_workers_), 0);
    int running = 0;
    const int slots = std::max(1, hardware_threads() / std::max(1, runtime_->devices()[0].cores));
    auto post = [&](int w) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            jobs_[std::size_t(w)] = job_of[std::size_t(w)];
        }
        posted[std::size_t(w)] = 1;
        ++running;
        cv_.notify_all();
    };
    auto pump = [&] {
        while (virtual_clock && running < slots) {
            int best = -1;
            for (int v = 0; v < num_workers_; ++v)
                if (state[std::size_t(v)] == State::Computing && !posted[std::size_t(v)] &&
                    (best < 0 || finish[std::size_t(v)] < finish[std::size_t(best)]))
                    best = v;
            if (best < 0) return;
            post(best);
        }
    };
    // Hands worker w its next mini-batch (pulling first if its copy is older than the
    // current version); false when the data is exhausted.
    auto dispatch = [&](int w) -> bool {
        if (exhausted || state[std::size_t(w)] == State::Lost) return false;
        auto b = next();
        if (!b) {
            exhausted = true;
            return false;
        }
        auto& ob = owned[std::size_t(w)];
        ob.x.assign(b->x.begin(), b->x.end());
        ob.y.assign(b->y.begin(), b->y.end());
        ob.w.assign(b->w.begin(), b->w.end());
        ob.size = b->size;
        ob.example_size = b->example_size;
        ob.y_per_example = b->y_per_example;
        pull(w);
        auto& wk = workers_[std::size_t(w)];
        const std::uint64_t n = wk.batches++;
        if (virtual_clock) finish[std::size_t(w)] = now_ + opt.stragglers.compute_seconds(opt.straggler_seed, w, n, opt.virtual_batch_seconds);
        cancel_[std::size_t(w)]->store(false);
        job_of[std::size_t(w)] = Job{true, ++step, n};
        if (remote_) {  // every server sends worker w its shards as they are now, tagged with the job
            const std::int64_t who = w;
            for (int sv = 0; sv < int(servers_.size()); ++sv)
                remote_->send(remote_->server_rank(sv), kSendParams, step, std::as_bytes(std::span<const std::int64_t>(&who, 1)));
        }
        state[std::size_t(w)] = State::Computing;
        posted[std::size_t(w)] = 0;
        if (!virtual_clock) post(w);
        if (rule_ == sync::Rule::Asynchronous) {
            const std::int64_t lo = slowest(completed, state);
            epoch_.ssp_gap_max = std::max(epoch_.ssp_gap_max, completed[std::size_t(w)] - lo);
        }
        return true;
    };
    auto take_result = [&](int w) -> Result {
        std::unique_lock<std::mutex> lock(mutex_);
        const bool ok = wait_running(cv_, lock, coordinator_wait(), [&] { return results_[std::size_t(w)].ready; });  // a suspended job does not time out
        if (!ok)
            throw_error<DistributedError>("ParameterServer: worker ", w, " of ", num_workers_, " did not finish its mini-batch within ",
                                          opt.timeout.count(), " ms");
        Result r = results_[std::size_t(w)];
        results_[std::size_t(w)] = Result{};
        posted[std::size_t(w)] = 0;
        --running;
        fifo_.erase(std::remove(fifo_.begin(), fifo_.end(), w), fifo_.end());
        return r;
    };
    auto take_any = [&]() -> int {
        std::unique_lock<std::mutex> lock(mutex_);
        const bool ok = wait_running(cv_, lock, coordinator_wait(), [&] { return !fifo_.empty(); });
        if (!ok) {
            std::string who;
            for (int w = 0; w < num_workers_; ++w)
                if (state[std::size_t(w)] == State::Computing) who += (who.empty() ? "" : ", ") + std::to_string(w);
            throw_error<DistributedError>("ParameterServer: worker(s) ", who, " of ", num_workers_, " did not finish a mini-batch within ",
                                          opt.timeout.count(), " ms");
        }
        return fifo_.front();
    };
    auto fail = [&](int w, const std::string& what) {
        throw_error<DistributedError>("ParameterServer: worker ", w, " of ", num_workers_, " failed: ", what);
    };
    // A worker rank that did not report: every mode but Synchronous goes on without it (its
    // mini-batch dropped); Synchronous, which needs every worker, stops naming it.
    auto lose = [&](int w, const Result& r) {
        remote_->mark_lost(remote_->worker_rank(w));
        if (rule_ == sync::Rule::Synchronous)
            fail(w, r.error + " (Synchronous needs every worker; the asynchronous and K modes go on without a lost one)");
        state[std::size_t(w)] = State::Lost;
        lost_.push_back(w);
        epoch_.lost_workers.push_back(w);  // into the report and the JSON (stats())
        epoch_.lost_ranks.push_back(remote_->worker_rank(w));
        ++epoch_.dropped;
        int left = 0;
        for (auto st : state) left += st != State::Lost;
        if (left == 0) fail(w, r.error + " (no worker left)");
        std::fprintf(stderr, "strata: warning: ParameterServer: %s; its mini-batch is dropped and training goes on with %d "
                             "of %d workers\n", r.error.c_str(), left, num_workers_);
    };
    // Stops every computing worker (between layers of its backward) and waits for it.
    auto cancel_computing = [&] {
        for (int w = 0; w < num_workers_; ++w)
            if (state[std::size_t(w)] == State::Computing) cancel_[std::size_t(w)]->store(true);
        cv_.notify_all();
        for (int w = 0; w < num_workers_; ++w) {
            if (state[std::size_t(w)] != State::Computing) continue;
            if (!posted[std::size_t(w)]) {  // virtual clock: never started for real, nothing to stop
                state[std::size_t(w)] = State::Idle;
                ++epoch_.cancelled;
                continue;
            }
            const Result r = take_result(w);
            state[std::size_t(w)] = State::Idle;
            if (r.failed && r.lost) {
                lose(w, r);
                continue;
            }
            if (r.failed) fail(w, r.error);
            if (remote_ && !r.cancelled) decide(w, kDiscard, job_of[std::size_t(w)].step);
            // Virtual clock: it was cancelled at this virtual time, whatever the threads did.
            // Real clock: one that finished before it saw the cancellation is a late push.
            if (r.cancelled || virtual_clock) ++epoch_.cancelled;
            else ++epoch_.dropped;
        }
    };
    auto admit = [&](int w, const UnitWork& u) {
        const std::int64_t staleness = version_ - workers_[std::size_t(w)].version;
        if (remote_) remote_push(w, job_of[std::size_t(w)].step);
        else push(w);
        ++pending;
        totals.loss_sum += u.loss_sum;
        totals.correct += double(u.correct);
        totals.examples += u.examples;
        ++epoch_.gradients;
        epoch_.staleness_sum += staleness;
        epoch_.staleness_max = std::max(epoch_.staleness_max, staleness);
        pending_max_staleness = std::max(pending_max_staleness, staleness);
        if (std::size_t(staleness) >= epoch_.histogram.size()) epoch_.histogram.resize(std::size_t(staleness) + 1);
        ++epoch_.histogram[std::size_t(staleness)];
    };
    // Applies the open update on every server; false when fit wants no more updates.
    auto close = [&]() -> bool {
        if (pending == 0) return true;
        const T inv = T(1) / T(totals.examples > 0 ? totals.examples : 1);
        if (remote_) remote_apply(inv);
        else server_pool_->run([&](int sv) { apply_inbox(servers_[std::size_t(sv)], inv); });
        ++version_;
        ++epoch_.updates;
        const StepTotals t = totals;
        const int g = pending;
        totals = StepTotals{};
        pending = 0;
        if (observer_) observer_(UpdateRecord{version_, clock_now(), g, pending_max_staleness});
        pending_max_staleness = 0;
        return on_step(t);
    };
    auto start_round = [&] {
        round_started = 0;
        for (int w = 0; w < num_workers_; ++w) {
            if (state[std::size_t(w)] == State::Lost) continue;
            if (!dispatch(w)) break;
            ++round_started;
        }
    };
    // SSP: worker w may start its next mini-batch only within B of the slowest.
    auto ssp_try = [&](int w) {
        if (staleness_bound_ >= 0) {
            const std::int64_t lo = slowest(completed, state);
            if (completed[std::size_t(w)] - lo > staleness_bound_) {
                state[std::size_t(w)] = State::Blocked;
                return;
            }
        }
        state[std::size_t(w)] = State::Idle;
        dispatch(w);
    };

    // The worker threads serve jobs until the coordinator is done with the epoch.
    auto worker_loop = [&](int w) {
        auto& wk = workers_[std::size_t(w)];
        auto& cancel = *cancel_[std::size_t(w)];
        for (;;) {
            Job job;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                cv_.wait(lock, [&] { return stop_ || jobs_[std::size_t(w)].pending; });
                if (!jobs_[std::size_t(w)].pending) return;
                job = jobs_[std::size_t(w)];
                jobs_[std::size_t(w)].pending = false;
            }
            Result r;
            bool reported = false;  // across processes: the worker rank finished and awaits a decision
            // Cancelled after it finished: across processes the worker rank is told to discard it.
            auto stop_if_cancelled = [&] {
                if (!cancel.load()) return;
                if (reported) decide(w, kDiscard, job.step);
                throw detail::Cancelled{};
            };
            try {
                const auto t0 = std::chrono::steady_clock::now();
                if (remote_) {
                    r.work = remote_work(w, owned[std::size_t(w)], job, cancel);
                    reported = true;
                } else {
                    r.work = work(w, owned[std::size_t(w)].view(), wk.params.data(), wk.grads.data(), 1.0, job.step,
                                  [&](std::int64_t, std::int64_t) {
                                      if (cancel.load(std::memory_order_relaxed)) throw detail::Cancelled{};
                                  });
                }
                stop_if_cancelled();
                if (!virtual_clock) {
                    const double measured = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                    const double delay = opt.stragglers.delay_seconds(opt.straggler_seed, w, job.n, measured);
                    if (delay > 0) {  // range-checked, and cut short by Ctrl-C (the step then ends as usual)
                        std::unique_lock<std::mutex> lock(mutex_);
                        Stragglers::sleep(cv_, lock, delay, [&] { return cancel.load() || stop_; });
                    }
                    stop_if_cancelled();
                }
            } catch (const detail::Cancelled&) {
                r.cancelled = true;
            } catch (const detail::WorkerLost& ex) {
                r.failed = true;
                r.lost = true;
                r.error = ex.what();
            } catch (const std::exception& ex) {
                r.failed = true;
                r.error = ex.what();
            } catch (...) {
                r.failed = true;
                r.error = "an exception that is not a std::exception";
            }
            {
                std::lock_guard<std::mutex> lock(mutex_);
                r.ready = true;
                results_[std::size_t(w)] = r;
                fifo_.push_back(w);
            }
            cv_.notify_all();
        }
    };

    auto coordinator = [&] {
        if (lockstep_rounds_) start_round();
        else
            for (int w = 0; w < num_workers_; ++w) dispatch(w);
        while (!stopping) {
            if (!deferred.empty()) {
                double soonest = 0;
                bool any = false;
                for (int v = 0; v < num_workers_; ++v)
                    if (state[std::size_t(v)] == State::Computing && (!any || finish[std::size_t(v)] < soonest)) {
                        soonest = finish[std::size_t(v)];
                        any = true;
                    }
                if (!any || soonest > now_) {
                    for (int v : deferred)
                        if (state[std::size_t(v)] == State::Idle) dispatch(v);
                    deferred.clear();
                }
            }
            if (computing() == 0) {
                // Nothing in flight: the data ran out (apply what has arrived), or waiting
                // workers can go on.
                if (pending > 0 && !close()) break;
                if (lockstep_rounds_) start_round();
                else
                    for (int w = 0; w < num_workers_; ++w)
                        if (state[std::size_t(w)] != State::Computing) dispatch(w);
                if (computing() == 0) break;
                continue;
            }
            int w = -1;
            if (virtual_clock) {
                for (int v = 0; v < num_workers_; ++v)
                    if (state[std::size_t(v)] == State::Computing && (w < 0 || finish[std::size_t(v)] < finish[std::size_t(w)])) w = v;
                now_ = finish[std::size_t(w)];
                pump();
                if (!posted[std::size_t(w)]) post(w);
            } else {
                w = take_any();
                clock_now();
            }
            const Result r = take_result(w);
            if (r.failed && r.lost) {
                lose(w, r);
                continue;
            }
            if (r.failed) fail(w, r.error);
            state[std::size_t(w)] = State::Idle;
            ++completed[std::size_t(w)];
            if (lockstep_rounds_) {
                if (workers_[std::size_t(w)].version != version_) {  // finished after its update closed
                    if (remote_) decide(w, kDiscard, job_of[std::size_t(w)].step);
                    ++epoch_.dropped;
                    continue;
                }
            }
            admit(w, r.work);
            if (rule_ == sync::Rule::Synchronous || rule_ == sync::Rule::KSync) {
                state[std::size_t(w)] = State::Waiting;
                const int need = rule_ == sync::Rule::Synchronous ? round_started : std::min(k_, round_started);
                if (pending == need) {
                    cancel_computing();
                    if (!close()) stopping = true;
                    else start_round();
                }
            } else if (rule_ == sync::Rule::KBatchSync) {
                if (pending == k_) {
                    deferred.clear();
                    cancel_computing();
                    if (!close()) stopping = true;
                    else start_round();
                } else if (virtual_clock) {
                    // Workers that finish at the same instant all arrive before any of them
                    // starts again (a restart cannot finish at this instant): with equal
                    // compute times K-batch-sync is then exactly synchronous.
                    deferred.push_back(w);
                } else {
                    dispatch(w);
                }
            } else if (rule_ == sync::Rule::KAsync) {
                state[std::size_t(w)] = State::Waiting;
                if (pending == k_) {
                    if (!close()) stopping = true;
                    else
                        for (int v = 0; v < num_workers_; ++v)
                            if (state[std::size_t(v)] == State::Waiting) dispatch(v);
                }
            } else if (rule_ == sync::Rule::KBatchAsync) {
                if (pending == k_ && !close()) stopping = true;
                else dispatch(w);
            } else {  // Asynchronous<B>
                if (!close()) {
                    stopping = true;
                } else {
                    ssp_try(w);
                    for (int v = 0; v < num_workers_; ++v)
                        if (state[std::size_t(v)] == State::Blocked) ssp_try(v);
                }
            }
        }
        cancel_computing();
        epoch_.seconds = clock_now() - epoch_start;
        total_.add(epoch_);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
        }
        cv_.notify_all();
    };
    auto stop_workers = [&] {
        for (auto& c : cancel_) c->store(true);
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;
            for (auto& j : jobs_) j.pending = false;
        }
        cv_.notify_all();
    };
    try {
        runtime_->pool().run_with(worker_loop, [](int) {}, coordinator, stop_workers);
    } catch (const std::exception& e) {
        for (auto& srv : servers_) srv.received = 0;  // the open update is abandoned
        if (remote_) {  // the other ranks stop now, with the reason, instead of at their deadline
            remote_->mark_lost(-1);
            const std::string why = e.what();
            for (int r = 1; r < remote_->processes(); ++r)
                remote_->send(r, kAbort, 0, std::as_bytes(std::span<const char>(why.data(), why.size())));
        }
        throw;
    } catch (...) {
        for (auto& srv : servers_) srv.received = 0;
        throw;
    }
    if (remote_) {
        std::vector<std::int64_t> gone;
        for (int w : lost_) gone.push_back(remote_->worker_rank(w));
        // First word: the stop decided here (a signal on this rank, or one a worker or server
        // reported); every rank takes it (epoch_ended), so SIGTERM to any one rank stops all.
        std::vector<std::int64_t> end{stop_request()};
        end.insert(end.end(), gone.begin(), gone.end());
        for (int r = 1; r < remote_->processes(); ++r)
            if (std::find(gone.begin(), gone.end(), r) == gone.end())
                remote_->send(r, kEnd, 0, std::as_bytes(std::span<const std::int64_t>(end)));
        gone_ranks_ = gone;
        sync_mirror();
    }
}

template <class P, class T>
template <class Y>
UnitWork ParameterServerCore<P, T>::remote_work(int w, const OwnedBatch<Y>& ob, const Job& job, std::atomic<bool>& cancel) {
    const int rank = remote_->worker_rank(w);
    std::vector<std::byte> bytes;
    const std::int64_t head[6] = {ob.size, ob.example_size, ob.y_per_example, std::int64_t(ob.x.size()),
                                  std::int64_t(ob.y.size()), std::int64_t(ob.w.size())};
    put(bytes, head, 6);
    put(bytes, ob.x.data(), ob.x.size());
    put(bytes, ob.y.data(), ob.y.size());
    put(bytes, ob.w.data(), ob.w.size());
    remote_->send(rank, kJob, job.step, bytes);
    bool cancel_sent = false;
    // The worker first pulls from every server, each pull with the timeout, and reports a
    // server that does not answer; so its report may come up to a timeout later than its
    // computation alone would take, and is waited for that long: a server's death is then
    // named by the worker's pull, not mistaken for the worker's.
    const auto report_wait = 2 * timeout();
    RunningDeadline d(report_wait, std::chrono::milliseconds(2));
    for (int spins = 0;; ++spins) {
        if (auto m = remote_->try_receive(rank)) {
            if (m->step != job.step) continue;
            if (m->kind == kCancelled) throw detail::Cancelled{};
            if (m->kind == kFailed)
                throw DistributedError(std::string(reinterpret_cast<const char*>(m->payload.data()), m->payload.size()));
            UnitWork u;
            const std::byte* in = m->payload.data();
            in = get(in, &u.loss_sum, 1);
            in = get(in, &u.correct, 1);
            in = get(in, &u.examples, 1);
            std::int64_t stop = 0;
            if (m->payload.size() >= 4 * sizeof(std::int64_t)) get(in, &stop, 1);
            take_stop(int(stop));  // the worker's rank caught a signal: stop after this update
            return u;
        }
        if (!cancel_sent && cancel.load()) {
            remote_->send(rank, kCancel, job.step, {});
            cancel_sent = true;
        }
        if (d.expired())
            throw detail::WorkerLost(remote_->name(rank) + " did not report its mini-batch within " +
                                     std::to_string(report_wait.count()) + " ms (twice the timeout: its pulls, then its computation)");
        if (spins > 256) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

template <class P, class T>
template <class Y>
void ParameterServerCore<P, T>::work_epoch(int w, Work<Y> work) {
    const int coord = remote_->coordinator_rank();
    auto& wk = workers_[std::size_t(w)];
    OwnedBatch<Y> ob;
    for (;;) {
        const auto m = remote_->receive(coord, "ParameterServer: the coordinator's next mini-batch", idle_timeout());
        if (m.kind == kEnd) return epoch_ended(m);
        if (m.kind == kAbort) coordinator_stopped(m);
        if (m.kind != kJob) continue;  // a cancellation or decision that came too late
        std::int64_t head[6];
        const std::byte* in = get(m.payload.data(), head, 6);
        ob.size = head[0];
        ob.example_size = head[1];
        ob.y_per_example = head[2];
        ob.x.resize(std::size_t(head[3]));
        ob.y.resize(std::size_t(head[4]));
        ob.w.resize(std::size_t(head[5]));
        in = get(in, ob.x.data(), ob.x.size());
        in = get(in, ob.y.data(), ob.y.size());
        get(in, ob.w.data(), ob.w.size());
        std::string pull_error;
        for (int sv = 0; sv < int(servers_.size()) && pull_error.empty(); ++sv) {
            const auto& srv = servers_[std::size_t(sv)];
            for (;;) {  // shards sent for jobs cancelled before they were posted are older: skipped
                Received p;
                try {
                    p = remote_->receive(remote_->server_rank(sv), "ParameterServer: pull reply", timeout());
                } catch (const DistributedError& e) {  // the coordinator hears why, and names the server
                    pull_error = e.what();
                    break;
                }
                if (p.step != m.step) continue;
                const T* v = reinterpret_cast<const T*>(p.payload.data());
                for (std::size_t i = 0; i < srv.ranges.size(); ++i)
                    copy(TensorView<T, place::Host>(const_cast<T*>(v) + srv.compact[i], Shape{srv.ranges[i].count}),
                         TensorView<T, P>(wk.params.data() + srv.ranges[i].first, Shape{srv.ranges[i].count}));
                break;
            }
        }
        if (!pull_error.empty()) {
            remote_->send(coord, kFailed, m.step, std::as_bytes(std::span<const char>(pull_error.data(), pull_error.size())));
            continue;
        }
        UnitWork u;
        std::string error;
        bool cancelled = false;
        try {
            u = work(w, ob.view(), wk.params.data(), wk.grads.data(), 1.0, m.step, [&](std::int64_t, std::int64_t) {
                while (auto c = remote_->try_receive(coord)) {
                    if (c->kind == kAbort) coordinator_stopped(*c);
                    if (c->kind == kCancel && c->step == m.step) throw detail::Cancelled{};
                }
            });
        } catch (const detail::Cancelled&) {
            cancelled = true;
        } catch (const std::exception& e) {
            error = std::string("worker ") + std::to_string(w) + ": " + e.what();
        }
        if (cancelled) {
            remote_->send(coord, kCancelled, m.step, {});
            continue;
        }
        if (!error.empty()) {
            remote_->send(coord, kFailed, m.step, std::as_bytes(std::span<const char>(error.data(), error.size())));
            continue;
        }
        std::vector<std::byte> done;
        put(done, &u.loss_sum, 1);
        put(done, &u.correct, 1);
        put(done, &u.examples, 1);
        const std::int64_t stop = stop_request();  // a signal here: the coordinator stops the job
        put(done, &stop, 1);
        remote_->send(coord, kDone, m.step, done);
        for (;;) {
            const auto dcs = remote_->receive(coord, "ParameterServer: the coordinator's decision on a mini-batch", idle_timeout());
            if (dcs.kind == kAbort) coordinator_stopped(dcs);
            if (dcs.step != m.step || dcs.kind == kCancel) continue;
            if (dcs.kind == kPushNow) {
                const auto g = to_vector(wk.grads.view());
                for (int sv = 0; sv < int(servers_.size()); ++sv) {
                    const auto& srv = servers_[std::size_t(sv)];
                    std::vector<T> mine(std::size_t(srv.size));
                    for (std::size_t i = 0; i < srv.ranges.size(); ++i)
                        std::copy_n(g.begin() + srv.ranges[i].first, srv.ranges[i].count, mine.begin() + srv.compact[i]);
                    remote_->send(remote_->server_rank(sv), kPush, m.step, std::as_bytes(std::span<const T>(mine)));
                }
            }
            break;  // pushed, or discarded
        }
    }
}

template <class P, class T>
void ParameterServerCore<P, T>::serve_epoch() {
    const int coord = remote_->coordinator_rank();
    auto& srv = servers_[std::size_t(remote_->index())];
    for (;;) {
        const auto m = remote_->receive(coord, "ParameterServer: the coordinator's next command", idle_timeout());
        if (m.kind == kAbort) coordinator_stopped(m);
        if (m.kind == kEnd) return epoch_ended(m);
        if (m.kind == kSendParams || m.kind == kAdmit) {
            std::int64_t w = 0;
            get(m.payload.data(), &w, 1);
            if (m.kind == kSendParams) {
                const auto v = to_vector(srv.params.view());
                remote_->send(remote_->worker_rank(int(w)), kParams, m.step, std::as_bytes(std::span<const T>(v)));
            } else {
                // A worker that died between its report and its push: the update goes on without
                // it (the coordinator finds the worker lost at its next mini-batch).
                std::optional<Received> got;
                try {
                    got = remote_->receive(remote_->worker_rank(int(w)), "ParameterServer: push", timeout());
                } catch (const DistributedError& e) {
                    std::fprintf(stderr, "strata: warning: %s; the update goes on without it\n", e.what());
                    continue;
                }
                const auto& p = *got;
                STRATA_CHECK(p.kind == kPush && p.step == m.step, DistributedError, "ParameterServer: ",
                             remote_->name(p.source), " pushed mini-batch ", p.step, " (message ", p.kind, "), expected ", m.step);
                if (srv.size == 0) continue;
                if (int(srv.inbox.size()) <= srv.received) srv.inbox.emplace_back(Shape{srv.size});
                copy(TensorView<T, place::Host>(reinterpret_cast<T*>(const_cast<std::byte*>(p.payload.data())), Shape{srv.size}),
                     srv.inbox[std::size_t(srv.received++)].view());
            }
        } else if (m.kind == kApply) {
            T inv{};
            get(m.payload.data(), &inv, 1);
            apply_inbox(srv, inv);
            const std::int64_t stop = stop_request();  // a signal here: the coordinator stops the job
            remote_->send(coord, kAck, m.step, std::as_bytes(std::span<const std::int64_t>(&stop, 1)));
        }
    }
}

template <class P, class T>
void ParameterServerCore<P, T>::sync_mirror() {
    const int me_server = remote_->role() == Role::Server ? remote_->index() : -1;
    for (int sv = 0; sv < int(servers_.size()); ++sv) {
        auto& srv = servers_[std::size_t(sv)];
        const int from = remote_->server_rank(sv);
        if (sv == me_server) {
            std::vector<std::byte> bytes;
            const auto p = to_vector(srv.params.view());
            put(bytes, p.data(), p.size());
            for (auto& [name, t] : srv.opt.slots()) {
                const auto v = to_vector(t.view());
                put(bytes, v.data(), v.size());
            }
            const std::int64_t it = srv.opt.iterations();
            put(bytes, &it, 1);
            for (int r = 0; r < remote_->processes(); ++r)
                if (r != from && std::find(gone_ranks_.begin(), gone_ranks_.end(), r) == gone_ranks_.end())
                    remote_->send(r, kState, 0, bytes);
            continue;
        }
        const auto m = remote_->receive(from, "ParameterServer: the servers' state after the epoch", idle_timeout());
        if (m.kind == kAbort) coordinator_stopped(m);
        STRATA_CHECK(m.kind == kState, DistributedError, "ParameterServer: ", remote_->name(from), " sent message ", m.kind,
                     " where its state was expected");
        const std::byte* in = m.payload.data();
        auto take = [&](Tensor<T, P>& t, std::int64_t n) {
            std::vector<T> v(static_cast<std::size_t>(n));
            in = get(in, v.data(), v.size());
            if (n > 0) copy(TensorView<T, place::Host>(v.data(), Shape{n}), t.view());
        };
        take(srv.params, srv.size);
        for (auto& [name, t] : srv.opt.slots()) take(t, srv.size);
        std::int64_t it = 0;
        get(in, &it, 1);
        srv.opt.set_iterations(it);
    }
}

template <class P, class T>
void ParameterServerCore<P, T>::plan() {
    const auto& infos = infos_;
    std::vector<std::vector<std::int64_t>> shapes;
    std::vector<std::int64_t> offsets;
    for (const auto& p : infos) {
        shapes.emplace_back(p.shape.begin(), p.shape.end());
        offsets.push_back(p.offset);
    }
    if (const auto* f = std::get_if<FixedShards>(&config_->ps_options().partitioner)) {
        std::int64_t most_rows = 0;
        for (const auto& s : shapes) most_rows = std::max(most_rows, s.empty() ? 1 : s[0]);
        STRATA_CHECK(f->num_shards <= most_rows, ValueError, "ParameterServer: FixedShards(", f->num_shards,
                     ") asks for more shards than any variable has rows (the largest axis 0 is ", most_rows, ")");
    }
    shards_ = plan_shards(config_->ps_options().partitioner, shapes, offsets, sizeof(T), config_->num_servers());
    servers_.resize(std::size_t(config_->num_servers()));
    for (const auto& sh : shards_) {
        auto& srv = servers_[std::size_t(sh.server)];
        srv.ranges.push_back(sh);
        srv.compact.push_back(srv.size);
        srv.size += sh.count;
    }
}

}  // namespace detail

#if STRATA_INSTANCES
// The host's parameter-server path is compiled once in the compiled part, for every sync mode.
STRATA_TEMPLATE class detail::ParameterServerCore<place::Host, float>;
STRATA_TEMPLATE class detail::ParameterServerCore<place::Host, double>;
STRATA_TEMPLATE void detail::ParameterServerCore<place::Host, float>::epoch_run<std::int32_t>(
    detail::ParameterServerCore<place::Host, float>::Next<std::int32_t>, std::uint64_t&,
    detail::ParameterServerCore<place::Host, float>::Work<std::int32_t>, detail::ParameterServerCore<place::Host, float>::OnStep);
#endif

template <class P, class Sync, class Net, class T>
class GradientPath<ParameterServer<P, Sync>, Net, T> : public detail::PathBase<GradientPath<ParameterServer<P, Sync>, Net, T>>,
                                                       public detail::ParameterServerCore<P, T> {
    using Core = detail::ParameterServerCore<P, T>;

public:
    using value_type = T;
    using place_type = P;
    /// Workers take whole mini-batches on their own schedule: no global batch, no step pieces.
    static constexpr bool lockstep = false;

    template <class Init>
    GradientPath(ParameterServer<P, Sync>& s, Init&& init)
        : Core(s, s, Net::num_params, Net::parameters(), [] { return distribute::detail::model_settings<Net, T>(); },
               [&](T* p) { init(p); }) {}

    using Core::expected_updates;
    using Core::is_chief;
    // The defaults this path takes, by name (detail::PathBase says why).
    using Base = detail::PathBase<GradientPath>;
    using Base::pipelined, Base::unit_network, Base::gradient_buckets, Base::per_worker_input, Base::unit_share;
    using Base::sum_over_workers, Base::sum_outputs_over_workers, Base::after_save, Base::gathers_state, Base::bind_unit;
    using Base::model_summary;
    using Base::syncs_batch_statistics, Base::replica_sum;

    /// One epoch: mini-batches from `source` (each one worker's), updates by the mode's rule,
    /// `on_step(StepTotals)` after every update (false: stop).
    template <class Source, class Work, class OnStep>
    void run_epoch(Source& source, std::uint64_t& step, Work&& work, OnStep&& on_step) {
        using Y = std::remove_cv_t<std::remove_pointer_t<decltype(source.next())>>;
        using Yv = std::remove_cv_t<typename decltype(std::declval<Y>().y)::value_type>;
        auto next = [&]() -> std::optional<ReplicaBatch<Yv>> {
            const auto* b = source.next();
            if (!b) return std::nullopt;
            return split_batch(*b, 1, 0);
        };
        Core::template epoch_run<Yv>(next, step, work, on_step);
    }

    /// One update on one batch: its W slices are the workers' mini-batches.
    template <class Y, class Work>
    StepTotals train_step(const data::Batch<Y>& batch, std::uint64_t& step, Work&& work) {
        const int workers = this->units();
        int i = 0;
        auto next = [&]() -> std::optional<ReplicaBatch<Y>> {
            while (i < workers) {
                auto b = split_batch(batch, workers, i++);
                if (b.size > 0) return b;
            }
            return std::nullopt;
        };
        StepTotals out;
        auto first_update = [&](const StepTotals& t) {
            out = t;
            return false;
        };
        Core::template epoch_run<Y>(next, step, work, first_update);
        return out;
    }

    /// At an epoch's end: its figures into fit's logs, its staleness histogram into the History.
    template <class Logs, class History>
    void end_epoch(Logs& logs, History& history) const {
        epoch_figures(logs);
        history.staleness.push_back(this->staleness_histogram());
    }
    template <class Logs>
    void epoch_figures(Logs& logs) const {
        const auto& e = this->epoch_stats();
        logs.set("updates", double(e.updates));
        logs.set("cancelled", double(e.cancelled));
        logs.set("dropped", double(e.dropped));
        logs.set("staleness_max", double(e.staleness_max));
        logs.set("staleness_mean", e.staleness_mean());
        logs.set("seconds", e.seconds);
    }
};

}  // namespace strata::distribute
