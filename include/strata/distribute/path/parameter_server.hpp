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
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/parameter_server.hpp"
#include "strata/distribute/parameter_server_stats.hpp"
#include "strata/distribute/replica_pool.hpp"

namespace strata::distribute {

namespace detail {
struct Cancelled {};  // thrown by backward's hook to stop a cancelled mini-batch between layers
}  // namespace detail

template <class P, class Sync, class Net, class T>
class GradientPath<ParameterServer<P, Sync>, Net, T> : public detail::PathBase<GradientPath<ParameterServer<P, Sync>, Net, T>> {
    using Strategy = ParameterServer<P, Sync>;
    static constexpr std::int64_t num_params = Net::num_params;

public:
    using value_type = T;
    using place_type = P;
    /// Workers take whole mini-batches on their own schedule: no global batch, no step pieces.
    static constexpr bool lockstep = false;

    template <class Init>
    GradientPath(Strategy& s, Init&& init)
        : strategy_(&s), rule_(s.rule()),
          lockstep_rounds_(rule_ == sync::Rule::Synchronous || rule_ == sync::Rule::KSync || rule_ == sync::Rule::KBatchSync),
          W_(s.num_workers()), K_(s.k()), B_(s.staleness_bound()) {
        plan();
        distribute::detail::check_units_fit_memory("ParameterServer", "workers", W_, 2 * std::uint64_t(num_params) * sizeof(T),
                                                   "a pulled copy of the variables and a gradient");
        workers_.resize(std::size_t(W_));
        s.run_replicas([&](int w) {  // on the worker's thread: its logical device's memory
            workers_[std::size_t(w)].params.resize(Shape{num_params});
            workers_[std::size_t(w)].grads.resize(Shape{num_params});
        });
        server_pool_ = std::make_unique<ReplicaPool>(s.num_servers(), [](int) { set_num_threads(1); }, true);
        server_pool_->run([&](int sv) {
            auto& srv = servers_[std::size_t(sv)];
            srv.params.resize(Shape{srv.size});
        });
        // The initial values, computed once and sent to each server as its shards.
        Tensor<T, P> full(Shape{num_params});
        init(full.data());
        const auto host = to_vector(full.view());
        set_weights(host);
        for (int i = 0; i < W_; ++i) cancel_.push_back(std::make_unique<std::atomic<bool>>(false));
        jobs_.resize(std::size_t(W_));
        results_.resize(std::size_t(W_));
    }

    GradientPath(const GradientPath&) = delete;
    GradientPath& operator=(const GradientPath&) = delete;

    int units() const { return W_; }
    template <class F>
    void run_units(F&& f) {
        STRATA_CHECK(!in_epoch_, ValueError,
                     "ParameterServer: evaluate/predict cannot run inside an epoch (the workers are busy training); call "
                     "them between epochs (fit's validation_data does) or after fit");
        strategy_->run_replicas(std::forward<F>(f));
    }

    void compile(const optim::Optimizer& o) {
        server_pool_->run([&](int sv) {
            auto& srv = servers_[std::size_t(sv)];
            srv.opt = optim::OptimizerState<T, P>(o, srv.size);
        });
        compiled_ = true;
    }

    /// Every worker pulls the current version (evaluate and predict compute with it).
    void prepare_inference() {
        for (int w = 0; w < W_; ++w) pull(w);
    }
    const T* inference_params(int w) { return workers_[std::size_t(w)].params.data(); }

    // ---- the schedule -----------------------------------------------------------------------

    /// One epoch: mini-batches from `source` (each one worker's), updates by the mode's rule,
    /// `on_step(StepTotals)` after every update (false: stop).
    template <class Source, class Work, class OnStep>
    void run_epoch(Source& source, std::uint64_t& step, Work&& work, OnStep&& on_step) {
        using Y = std::remove_cv_t<std::remove_pointer_t<decltype(source.next())>>;
        using Yv = typename decltype(std::declval<Y>().y)::value_type;
        auto next = [&]() -> std::optional<ReplicaBatch<std::remove_cv_t<Yv>>> {
            const auto* b = source.next();
            if (!b) return std::nullopt;
            return split_batch(*b, 1, 0);
        };
        epoch_run<std::remove_cv_t<Yv>>(next, step, work, on_step);
    }

    /// One update on one batch: its W slices are the workers' mini-batches.
    template <class Y, class Work>
    StepTotals train_step(const data::Batch<Y>& batch, std::uint64_t& step, Work&& work) {
        int i = 0;
        auto next = [&]() -> std::optional<ReplicaBatch<Y>> {
            while (i < W_) {
                auto b = split_batch(batch, W_, i++);
                if (b.size > 0) return b;
            }
            return std::nullopt;
        };
        StepTotals out;
        auto first_update = [&](const StepTotals& t) {
            out = t;
            return false;
        };
        epoch_run<Y>(next, step, work, first_update);
        return out;
    }

    /// Updates an epoch over `batches` mini-batches is expected to make (-1: not known ahead).
    std::int64_t expected_updates(std::int64_t batches) const {
        if (batches < 0) return -1;
        if (rule_ == sync::Rule::Synchronous || rule_ == sync::Rule::KSync) return (batches + W_ - 1) / W_;
        else if (rule_ == sync::Rule::KBatchSync) return -1;  // cancelled batches are not known ahead
        else return (batches + K_ - 1) / K_;
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

    /// At an epoch's end: its figures into fit's logs, its staleness histogram into the History.
    template <class Logs, class History>
    void end_epoch(Logs& logs, History& history) const {
        epoch_figures(logs);
        history.staleness.push_back(staleness_histogram());
    }
    template <class Logs>
    void epoch_figures(Logs& logs) const {
        logs.set("updates", double(epoch_.updates));
        logs.set("cancelled", double(epoch_.cancelled));
        logs.set("dropped", double(epoch_.dropped));
        logs.set("staleness_max", double(epoch_.staleness_max));
        logs.set("staleness_mean", epoch_.staleness_mean());
        logs.set("seconds", epoch_.seconds);
    }
    std::vector<std::int64_t> staleness_histogram() const { return epoch_.histogram; }

    /// The shard plan: which rows of which variable each server holds.
    const std::vector<ShardRange>& shards() const { return shards_; }

    // ---- variables ----------------------------------------------------------------------------

    std::vector<T> get_weights() const {
        std::vector<T> out(static_cast<std::size_t>(num_params));
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
            std::vector<T> v(static_cast<std::size_t>(num_params));
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

    void log_placement() {
        if (!place::get_log_device_placement()) return;
        const auto infos = Net::parameters();
        const auto& devs = strategy_->server_devices();
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
    enum class State { Idle, Computing, Waiting, Blocked };
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

    void plan() {
        const auto infos = Net::parameters();
        std::vector<std::vector<std::int64_t>> shapes;
        std::vector<std::int64_t> offsets;
        for (const auto& p : infos) {
            shapes.emplace_back(p.shape.begin(), p.shape.end());
            offsets.push_back(p.offset);
        }
        if (const auto* f = std::get_if<FixedShards>(&strategy_->ps_options().partitioner)) {
            std::int64_t most_rows = 0;
            for (const auto& s : shapes) most_rows = std::max(most_rows, s.empty() ? 1 : s[0]);
            STRATA_CHECK(f->num_shards <= most_rows, ValueError, "ParameterServer: FixedShards(", f->num_shards,
                         ") asks for more shards than any variable has rows (the largest axis 0 is ", most_rows, ")");
        }
        shards_ = plan_shards(strategy_->ps_options().partitioner, shapes, offsets, sizeof(T), strategy_->num_servers());
        servers_.resize(std::size_t(strategy_->num_servers()));
        for (const auto& sh : shards_) {
            auto& srv = servers_[std::size_t(sh.server)];
            srv.ranges.push_back(sh);
            srv.compact.push_back(srv.size);
            srv.size += sh.count;
        }
    }

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

    template <class Y, class Next, class Work, class OnStep>
    void epoch_run(Next& next, std::uint64_t& step, Work& work, OnStep& on_step) {
        STRATA_CHECK(compiled_, ValueError, "ParameterServer: the model is not compiled");
        STRATA_CHECK(!in_epoch_, ValueError, "ParameterServer: fit or train_step called from inside an epoch (a callback)");
        const auto& opt = strategy_->ps_options();
        const bool virtual_clock = opt.clock == Clock::Virtual;
        std::vector<OwnedBatch<Y>> owned(static_cast<std::size_t>(W_));
        std::vector<State> state(std::size_t(W_), State::Idle);
        std::vector<double> finish(std::size_t(W_), 0.0);
        std::vector<std::int64_t> completed(std::size_t(W_), 0);
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
        std::vector<Job> job_of(static_cast<std::size_t>(W_));
        std::vector<char> posted(std::size_t(W_), 0);
        int running = 0;
        const int slots = std::max(1, hardware_threads() / std::max(1, strategy_->devices()[0].cores));
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
                for (int v = 0; v < W_; ++v)
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
            if (exhausted) return false;
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
            state[std::size_t(w)] = State::Computing;
            posted[std::size_t(w)] = 0;
            if (!virtual_clock) post(w);
            if (rule_ == sync::Rule::Asynchronous) {
                std::int64_t lo = completed[0];
                for (auto c : completed) lo = std::min(lo, c);
                epoch_.ssp_gap_max = std::max(epoch_.ssp_gap_max, completed[std::size_t(w)] - lo);
            }
            return true;
        };
        auto take_result = [&](int w) -> Result {
            std::unique_lock<std::mutex> lock(mutex_);
            const bool ok = wait_running(cv_, lock, opt.timeout, [&] { return results_[std::size_t(w)].ready; });  // a suspended job does not time out
            if (!ok)
                throw_error<DistributedError>("ParameterServer: worker ", w, " of ", W_, " did not finish its mini-batch within ",
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
            const bool ok = wait_running(cv_, lock, opt.timeout, [&] { return !fifo_.empty(); });
            if (!ok) {
                std::string who;
                for (int w = 0; w < W_; ++w)
                    if (state[std::size_t(w)] == State::Computing) who += (who.empty() ? "" : ", ") + std::to_string(w);
                throw_error<DistributedError>("ParameterServer: worker(s) ", who, " of ", W_, " did not finish a mini-batch within ",
                                              opt.timeout.count(), " ms");
            }
            return fifo_.front();
        };
        auto fail = [&](int w, const std::string& what) {
            throw_error<DistributedError>("ParameterServer: worker ", w, " of ", W_, " failed: ", what);
        };
        // Stops every computing worker (between layers of its backward) and waits for it.
        auto cancel_computing = [&] {
            for (int w = 0; w < W_; ++w)
                if (state[std::size_t(w)] == State::Computing) cancel_[std::size_t(w)]->store(true);
            cv_.notify_all();
            for (int w = 0; w < W_; ++w) {
                if (state[std::size_t(w)] != State::Computing) continue;
                if (!posted[std::size_t(w)]) {  // virtual clock: never started for real, nothing to stop
                    state[std::size_t(w)] = State::Idle;
                    ++epoch_.cancelled;
                    continue;
                }
                const Result r = take_result(w);
                state[std::size_t(w)] = State::Idle;
                if (r.failed) fail(w, r.error);
                // Virtual clock: it was cancelled at this virtual time, whatever the threads did.
                // Real clock: one that finished before it saw the cancellation is a late push.
                if (r.cancelled || virtual_clock) ++epoch_.cancelled;
                else ++epoch_.dropped;
            }
        };
        auto admit = [&](int w, const UnitWork& u) {
            const std::int64_t staleness = version_ - workers_[std::size_t(w)].version;
            push(w);
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
            server_pool_->run([&](int sv) {
                auto& srv = servers_[std::size_t(sv)];
                if (srv.size == 0 || srv.received == 0) return;
                const Shape sh{srv.size};
                auto acc = srv.inbox[0].view();
                for (int i = 1; i < srv.received; ++i) axpy(T(1), srv.inbox[std::size_t(i)].view(), acc);
                scale(acc, inv, acc);
                srv.opt.apply(srv.params.data(), acc.data());
                srv.received = 0;
            });
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
            for (int w = 0; w < W_; ++w) {
                if (!dispatch(w)) break;
                ++round_started;
            }
        };
        // SSP: worker w may start its next mini-batch only within B of the slowest.
        auto ssp_try = [&](int w) {
            if (B_ >= 0) {
                std::int64_t lo = completed[0];
                for (auto c : completed) lo = std::min(lo, c);
                if (completed[std::size_t(w)] - lo > B_) {
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
                try {
                    const auto t0 = std::chrono::steady_clock::now();
                    r.work = work(w, owned[std::size_t(w)].view(), wk.params.data(), wk.grads.data(), 1.0, job.step,
                                  [&](std::int64_t, std::int64_t) {
                                      if (cancel.load(std::memory_order_relaxed)) throw detail::Cancelled{};
                                  });
                    if (cancel.load()) throw detail::Cancelled{};
                    if (!virtual_clock) {
                        const double measured = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                        const double delay = opt.stragglers.delay_seconds(opt.straggler_seed, w, job.n, measured);
                        if (delay > 0) {  // range-checked, and cut short by Ctrl-C (the step then ends as usual)
                            std::unique_lock<std::mutex> lock(mutex_);
                            Stragglers::sleep(cv_, lock, delay, [&] { return cancel.load() || stop_; });
                        }
                        if (cancel.load()) throw detail::Cancelled{};
                    }
                } catch (const detail::Cancelled&) {
                    r.cancelled = true;
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
                for (int w = 0; w < W_; ++w) dispatch(w);
            while (!stopping) {
                if (!deferred.empty()) {
                    double soonest = 0;
                    bool any = false;
                    for (int v = 0; v < W_; ++v)
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
                        for (int w = 0; w < W_; ++w)
                            if (state[std::size_t(w)] != State::Computing) dispatch(w);
                    if (computing() == 0) break;
                    continue;
                }
                int w = -1;
                if (virtual_clock) {
                    for (int v = 0; v < W_; ++v)
                        if (state[std::size_t(v)] == State::Computing && (w < 0 || finish[std::size_t(v)] < finish[std::size_t(w)])) w = v;
                    now_ = finish[std::size_t(w)];
                    pump();
                    if (!posted[std::size_t(w)]) post(w);
                } else {
                    w = take_any();
                    clock_now();
                }
                const Result r = take_result(w);
                if (r.failed) fail(w, r.error);
                state[std::size_t(w)] = State::Idle;
                ++completed[std::size_t(w)];
                if (lockstep_rounds_) {
                    if (workers_[std::size_t(w)].version != version_) {  // finished after its update closed
                        ++epoch_.dropped;
                        continue;
                    }
                }
                admit(w, r.work);
                if (rule_ == sync::Rule::Synchronous || rule_ == sync::Rule::KSync) {
                    state[std::size_t(w)] = State::Waiting;
                    const int need = rule_ == sync::Rule::Synchronous ? round_started : std::min(K_, round_started);
                    if (pending == need) {
                        cancel_computing();
                        if (!close()) stopping = true;
                        else start_round();
                    }
                } else if (rule_ == sync::Rule::KBatchSync) {
                    if (pending == K_) {
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
                    if (pending == K_) {
                        if (!close()) stopping = true;
                        else
                            for (int v = 0; v < W_; ++v)
                                if (state[std::size_t(v)] == State::Waiting) dispatch(v);
                    }
                } else if (rule_ == sync::Rule::KBatchAsync) {
                    if (pending == K_ && !close()) stopping = true;
                    else dispatch(w);
                } else {  // Asynchronous<B>
                    if (!close()) {
                        stopping = true;
                    } else {
                        ssp_try(w);
                        for (int v = 0; v < W_; ++v)
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
            strategy_->pool().run_with(worker_loop, [](int) {}, coordinator, stop_workers);
        } catch (...) {
            for (auto& srv : servers_) srv.received = 0;  // the open update is abandoned
            throw;
        }
    }

    Strategy* strategy_;
    sync::Rule rule_;        // the sync mode's admission rule (the type's, or chosen at run time)
    bool lockstep_rounds_;   // Synchronous, KSync, KBatchSync: updates close rounds of dispatches
    int W_, K_, B_;
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

}  // namespace strata::distribute
