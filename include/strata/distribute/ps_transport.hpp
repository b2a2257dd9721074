#pragma once
/// \file strata/distribute/ps_transport.hpp
/// The data path behind a parameter server's pull, push and apply, as the coordinator drives it.
///
/// Owns the servers' threads (in process) and the coordinator's side of the messages (across
/// processes, ParameterServerOptions::processes); refers to the servers' shards and the
/// workers' copies (ps_shards.hpp), which ParameterServerCore owns. In one process a pull copies
/// every server's shards into the worker's buffer, a push copies the worker's gradient into each
/// server's inbox (one message per server), and an update applies every inbox on the server's
/// own thread. Across processes the same steps are messages (ps_messages.hpp) between the
/// coordinator (this rank), the server ranks and the worker ranks (ps_ranks.hpp runs theirs);
/// the coordinator still keeps its copy of each worker's version, which staleness is counted
/// against.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/function_ref.hpp"
#include "strata/distribute/parameter_server_processes.hpp"
#include "strata/distribute/ps_messages.hpp"
#include "strata/distribute/ps_shards.hpp"
#include "strata/distribute/ps_worker_pool.hpp"
#include "strata/distribute/rendezvous.hpp"
#include "strata/distribute/replica_pool.hpp"

namespace strata::distribute::detail {

template <class P, class T>
class PsTransport {
public:
    using Role = ParameterServerProcesses::Role;
    using Received = ParameterServerProcesses::Received;

    /// `remote`: the processes' roles and messages; null in one process. `timeout`:
    /// ParameterServerOptions::timeout.
    PsTransport(std::vector<PsServer<P, T>>& servers, std::vector<PsWorkerCopy<P, T>>& workers, ParameterServerProcesses* remote,
                std::chrono::milliseconds timeout)
        : servers_(&servers), workers_(&workers), remote_(remote), timeout_(timeout) {}

    /// One thread per server (the servers must be planned): their buffers live there.
    void start_servers() {
        server_pool_ = std::make_unique<ReplicaPool>(int(servers_->size()), [](int) { set_num_threads(1); }, true);
    }
    /// `f(s)` on server s's thread, for every server.
    void on_servers(FunctionRef<void(int)> f) { server_pool_->run(f); }

    ParameterServerProcesses* processes() const { return remote_; }
    std::vector<PsServer<P, T>>& servers() { return *servers_; }
    std::vector<PsWorkerCopy<P, T>>& workers() { return *workers_; }

    // How long the coordinator waits for a worker's result: across processes longer than the
    // proxy's own deadline, so that the proxy names the worker rank first.
    std::chrono::milliseconds coordinator_wait() const { return remote_ ? 2 * timeout_ + std::chrono::seconds(1) : timeout_; }
    std::chrono::milliseconds timeout() const { return timeout_; }
    // How long a server or worker waits for the coordinator's next word: the coordinator itself
    // may wait a timeout for a worker first.
    std::chrono::milliseconds idle_timeout() const { return 10 * timeout_; }

    // ---- pull, push, apply ------------------------------------------------------------------------

    /// Worker w's copy brought to `version` (every server's reply lands in its own buffer).
    void pull(int w, std::int64_t version) {
        auto& wk = (*workers_)[std::size_t(w)];
        if (wk.version == version) return;
        for (auto& srv : *servers_)
            for (std::size_t i = 0; i < srv.ranges.size(); ++i)
                copy(TensorView<T, P>(srv.params.data() + srv.compact[i], Shape{srv.ranges[i].count}),
                     TensorView<T, P>(wk.params.data() + srv.ranges[i].first, Shape{srv.ranges[i].count}));
        wk.version = version;
    }
    /// Across processes: every server sends worker w its shards as they are now, tagged with
    /// the job's `step` (the worker rank's pull).
    void send_shards(int w, std::uint64_t step) {
        if (!remote_) return;
        const std::int64_t who = w;
        for (int sv = 0; sv < int(servers_->size()); ++sv)
            remote_->send(remote_->server_rank(sv), ps_msg::kSendParams, step, std::as_bytes(std::span<const std::int64_t>(&who, 1)));
    }
    /// Worker w's gradient into the open update: one message per server, a copy of its shards;
    /// times `rescale` first (a loss scale's: Coordinator::admit).
    void push(int w, std::uint64_t step, double rescale = 1) {
        if (remote_) return remote_push(w, step, rescale);
        auto& wk = (*workers_)[std::size_t(w)];
        if (rescale != 1) scale(wk.grads.view(), T(rescale), wk.grads.view());
        for (auto& srv : *servers_) {
            if (srv.size == 0) continue;
            auto& msg = srv.next_message();
            for (std::size_t i = 0; i < srv.ranges.size(); ++i)
                copy(TensorView<T, P>(wk.grads.data() + srv.ranges[i].first, Shape{srv.ranges[i].count}),
                     TensorView<T, P>(msg.data() + srv.compact[i], Shape{srv.ranges[i].count}));
        }
    }
    /// Every server applies its inbox times `inv`, making `version` the next one. Where the
    /// optimizer needs the whole model's gradient first (global_clipnorm, a loss scale), each
    /// server's sum of squares is summed over the servers, in their order, and every server
    /// clips or skips by that sum: as one device does with the whole gradient.
    void apply(T inv, std::int64_t version) {
        if (remote_) return remote_apply(inv, version);
        if (!whole_gradient_first()) {
            on_servers([&](int sv) { (*servers_)[std::size_t(sv)].apply_inbox(inv); });
            return;
        }
        std::vector<double> part(servers_->size(), 0.0);
        on_servers([&](int sv) {
            auto& srv = (*servers_)[std::size_t(sv)];
            if (srv.reduce_inbox(inv)) part[std::size_t(sv)] = srv.reduced_squares();
        });
        double whole = 0;
        for (double x : part) whole += x;
        on_servers([&](int sv) { (*servers_)[std::size_t(sv)].apply_reduced(whole); });
    }
    /// Whether an update needs the whole model's sum of squares before any server applies.
    bool whole_gradient_first() const { return !servers_->empty() && (*servers_)[0].opt.clips_gradients(); }
    /// Across processes: worker w's finished mini-batch `step` is not pushed.
    void discard(int w, std::uint64_t step) {
        if (remote_) decide(w, ps_msg::kDiscard, step);
    }

    // ---- across processes: the coordinator's side -------------------------------------------------

    /// On worker w's proxy thread: the mini-batch computed by worker rank w (its totals), or
    /// Cancelled, or the worker's error; `cancel` is forwarded to it.
    template <class Y>
    UnitWork compute_remote(int w, const ps_msg::OwnedBatch<Y>& ob, std::uint64_t step, double divisor, std::atomic<bool>& cancel);

    /// Worker w is lost (its rank stopped answering): the job does not wait for it at exit.
    /// Returns its rank.
    int lose(int w) {
        const int rank = remote_->worker_rank(w);
        remote_->mark_lost(rank);
        return rank;
    }
    /// The coordinator failed with `why`: the open update is abandoned, and the other ranks stop
    /// now, with the reason, instead of at their deadline.
    void abandon(const std::string& why) {
        for (auto& srv : *servers_) srv.received = 0;
        if (!remote_) return;
        remote_->mark_lost(-1);
        for (int r = 1; r < remote_->processes(); ++r) remote_->send(r, ps_msg::kAbort, 0, ps_msg::text(why));
    }
    /// The coordinator's end of an epoch: every other rank learns the stop decided here and the
    /// workers lost so far (`lost`, by index), then every rank's mirror of the servers is synced.
    void end_epoch(const std::vector<int>& lost) {
        if (!remote_) return;
        std::vector<std::int64_t> gone;
        for (int w : lost) gone.push_back(remote_->worker_rank(w));
        // First word: the stop decided here (a signal on this rank, or one a worker or server
        // reported); every rank takes it (epoch_ended), so SIGTERM to any one rank stops all.
        std::vector<std::int64_t> end{ps_msg::stop_request()};
        end.insert(end.end(), gone.begin(), gone.end());
        for (int r = 1; r < remote_->processes(); ++r)
            if (std::find(gone.begin(), gone.end(), r) == gone.end())
                remote_->send(r, ps_msg::kEnd, 0, std::as_bytes(std::span<const std::int64_t>(end)));
        gone_ranks_ = gone;
        sync_mirror();
    }

    // ---- across processes: every rank ---------------------------------------------------------------

    /// Server or worker rank: the coordinator's end of an epoch, with the ranks of the workers
    /// lost so far. Every rank must learn them: the servers do not send their state to them, and
    /// no rank may call MPI_Finalize at exit, which waits for every rank (a worker that was
    /// stopped, then killed while the others were in it, left them waiting there for ever).
    /// Its first word is the stop the coordinator decided (the signal, 0: none): every rank's
    /// stop_signal() takes it, so each rank's StopOnSignal ends fit after this epoch and the
    /// program exits with that signal's status on every rank.
    void epoch_ended(const Received& m) {
        const std::size_t words = m.payload.size() / sizeof(std::int64_t);
        std::int64_t stop = 0;
        if (words > 0) ps_msg::get(m.payload.data(), &stop, 1);
        gone_ranks_.assign(words > 0 ? words - 1 : 0, 0);
        if (!gone_ranks_.empty())
            std::memcpy(gone_ranks_.data(), m.payload.data() + sizeof(std::int64_t), gone_ranks_.size() * sizeof(std::int64_t));
        for (auto r : gone_ranks_) remote_->mark_lost(int(r));
        ps_msg::take_stop(int(stop));
    }
    [[noreturn]] void coordinator_stopped(const Received& m) {
        remote_->mark_lost(-1);  // the job failed: no MPI_Finalize, which would wait for every rank
        throw DistributedError("ParameterServer: the coordinator stopped the job: " + ps_msg::text_of(m));
    }
    /// After an epoch: each server rank sends its shards, optimizer slots and iteration count to
    /// every other rank, so that every rank's copy of the servers is the same.
    void sync_mirror();

private:
    // The decision on a finished mini-batch (push it, or discard it).
    void decide(int w, std::uint32_t kind, std::uint64_t step) { remote_->send(remote_->worker_rank(w), kind, step, {}); }
    void remote_push(int w, std::uint64_t step, double rescale) {
        remote_->send(remote_->worker_rank(w), ps_msg::kPushNow, step, std::as_bytes(std::span<const double>(&rescale, 1)));
        const std::int64_t who = w;
        for (int sv = 0; sv < int(servers_->size()); ++sv)
            remote_->send(remote_->server_rank(sv), ps_msg::kAdmit, step, std::as_bytes(std::span<const std::int64_t>(&who, 1)));
    }
    void remote_apply(T inv, std::int64_t version);
    void send_state(int sv);
    void take_state(int sv, const Received& m);

    std::vector<PsServer<P, T>>* servers_;
    std::vector<PsWorkerCopy<P, T>>* workers_;
    ParameterServerProcesses* remote_;
    std::chrono::milliseconds timeout_;
    std::unique_ptr<ReplicaPool> server_pool_;
    std::vector<std::int64_t> gone_ranks_;  // across processes: lost workers' ranks, as the last epoch's end said
};

template <class P, class T>
void PsTransport<P, T>::remote_apply(T inv, std::int64_t version) {
    for (int sv = 0; sv < int(servers_->size()); ++sv)
        remote_->send(remote_->server_rank(sv), ps_msg::kApply, std::uint64_t(version), std::as_bytes(std::span<const T>(&inv, 1)));
    if (whole_gradient_first()) {
        // Each server reduced its inbox and sent its sum of squares; the whole sum goes back.
        double whole = 0;
        for (int sv = 0; sv < int(servers_->size()); ++sv) {
            const auto m = remote_->receive(remote_->server_rank(sv), "ParameterServer: a server's sum of squares", coordinator_wait());
            STRATA_CHECK(m.kind == ps_msg::kSquares && m.payload.size() == sizeof(double), DistributedError, "ParameterServer: ",
                         remote_->name(m.source), " sent message ", m.kind, " where its sum of squares was expected");
            double part = 0;
            ps_msg::get(m.payload.data(), &part, 1);
            whole += part;
        }
        for (int sv = 0; sv < int(servers_->size()); ++sv)
            remote_->send(remote_->server_rank(sv), ps_msg::kWhole, std::uint64_t(version),
                          std::as_bytes(std::span<const double>(&whole, 1)));
    }
    for (int sv = 0; sv < int(servers_->size()); ++sv) {
        const auto m = remote_->receive(remote_->server_rank(sv), "ParameterServer: update acknowledgement", coordinator_wait());
        STRATA_CHECK(m.kind == ps_msg::kAck, DistributedError, "ParameterServer: ", remote_->name(m.source), " sent message ", m.kind,
                     " where an acknowledgement was expected");
        std::int64_t stop = 0;
        if (m.payload.size() >= sizeof stop) ps_msg::get(m.payload.data(), &stop, 1);
        ps_msg::take_stop(int(stop));
        // Every server took the same decision from the same whole sum: the coordinator's copy
        // of the servers follows server 0's loss scale (the next jobs are handed out under it).
        if (sv == 0 && m.payload.size() == sizeof stop + ps_msg::kLossScaleBytes) {
            const auto st = ps_msg::get_loss_scale(m.payload.data() + sizeof stop);
            for (auto& srv : *servers_) srv.opt.set_loss_scale_state(st);
        }
    }
}

template <class P, class T>
template <class Y>
UnitWork PsTransport<P, T>::compute_remote(int w, const ps_msg::OwnedBatch<Y>& ob, std::uint64_t step, double divisor,
                                           std::atomic<bool>& cancel) {
    const int rank = remote_->worker_rank(w);
    // The job: the loss's divisor (Job::divisor), then the mini-batch.
    std::vector<std::byte> job;
    ps_msg::put(job, &divisor, 1);
    const auto batch = ob.encode();
    job.insert(job.end(), batch.begin(), batch.end());
    remote_->send(rank, ps_msg::kJob, step, job);
    bool cancel_sent = false;
    // The worker first pulls from every server, each pull with the timeout, and reports a
    // server that does not answer; so its report may come up to a timeout later than its
    // computation alone would take, and is waited for that long: a server's death is then
    // named by the worker's pull, not mistaken for the worker's.
    const auto report_wait = 2 * timeout_;
    RunningDeadline d(report_wait, std::chrono::milliseconds(2));
    for (int spins = 0;; ++spins) {
        if (auto m = remote_->try_receive(rank)) {
            if (m->step != step) continue;
            if (m->kind == ps_msg::kCancelled) throw Cancelled{};
            if (m->kind == ps_msg::kFailed) throw DistributedError(ps_msg::text_of(*m));
            return ps_msg::decode_done(m->payload);
        }
        if (!cancel_sent && cancel.load()) {
            remote_->send(rank, ps_msg::kCancel, step, {});
            cancel_sent = true;
        }
        if (d.expired())
            throw WorkerLost(remote_->name(rank) + " did not report its mini-batch within " + std::to_string(report_wait.count()) +
                             " ms (twice the timeout: its pulls, then its computation)");
        if (spins > 256) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

template <class P, class T>
void PsTransport<P, T>::sync_mirror() {
    const int me_server = remote_->role() == Role::Server ? remote_->index() : -1;
    for (int sv = 0; sv < int(servers_->size()); ++sv) {
        if (sv == me_server) {
            send_state(sv);
            continue;
        }
        const int from = remote_->server_rank(sv);
        auto m = remote_->receive(from, "ParameterServer: the servers' state after the epoch", idle_timeout());
        // A worker rank may still hold shards the server sent for a job the coordinator
        // cancelled before posting it (send_shards precedes the job): no job of this epoch will
        // take them now, and they precede the state (one sender, one order). Left unread, the
        // state check failed on them, and the server's send of them never completed at exit.
        while (m.kind == ps_msg::kParams && remote_->role() == Role::Worker)
            m = remote_->receive(from, "ParameterServer: the servers' state after the epoch", idle_timeout());
        if (m.kind == ps_msg::kAbort) coordinator_stopped(m);
        STRATA_CHECK(m.kind == ps_msg::kState, DistributedError, "ParameterServer: ", remote_->name(from), " sent message ", m.kind,
                     " where its state was expected");
        take_state(sv, m);
    }
}

// This rank's server's shards, slots and iteration count to every rank still there.
template <class P, class T>
void PsTransport<P, T>::send_state(int sv) {
    auto& srv = (*servers_)[std::size_t(sv)];
    const int from = remote_->server_rank(sv);
    std::vector<std::byte> bytes;
    const auto p = to_vector(srv.params.view());
    ps_msg::put(bytes, p.data(), p.size());
    for (auto& [name, t] : srv.opt.slots()) {
        const auto v = to_vector(t.view());
        ps_msg::put(bytes, v.data(), v.size());
    }
    const std::int64_t it = srv.opt.iterations();
    ps_msg::put(bytes, &it, 1);
    ps_msg::put_loss_scale(bytes, srv.opt.loss_scale_state());
    for (int r = 0; r < remote_->processes(); ++r)
        if (r != from && std::find(gone_ranks_.begin(), gone_ranks_.end(), r) == gone_ranks_.end()) remote_->send(r, ps_msg::kState, 0, bytes);
}

template <class P, class T>
void PsTransport<P, T>::take_state(int sv, const Received& m) {
    auto& srv = (*servers_)[std::size_t(sv)];
    const std::byte* in = m.payload.data();
    auto take = [&](Tensor<T, P>& t, std::int64_t n) {
        std::vector<T> v(static_cast<std::size_t>(n));
        in = ps_msg::get(in, v.data(), v.size());
        if (n > 0) copy(TensorView<T, place::Host>(v.data(), Shape{n}), t.view());
    };
    take(srv.params, srv.size);
    for (auto& [name, t] : srv.opt.slots()) take(t, srv.size);
    std::int64_t it = 0;
    in = ps_msg::get(in, &it, 1);
    srv.opt.set_iterations(it);
    srv.opt.set_loss_scale_state(ps_msg::get_loss_scale(in));
}

}  // namespace strata::distribute::detail
