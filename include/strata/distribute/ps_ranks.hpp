#pragma once
/// \file strata/distribute/ps_ranks.hpp
/// A parameter server across processes, as the server and worker ranks run an epoch: the
/// coordinator's commands (ps_messages.hpp) until its end of the epoch.
///
/// PsServerRank: send this server's shards to a worker (its pull), take a worker's push into
/// the inbox, apply the inbox and acknowledge. PsWorkerRank: take a job (a mini-batch), pull
/// its version's shards from every server, compute it (cancellable between layers of backward),
/// report its totals, and push or discard it as the coordinator decides. Either stops, naming
/// the reason, when the coordinator aborts the job.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/function_ref.hpp"
#include "strata/distribute/ps_messages.hpp"
#include "strata/distribute/ps_transport.hpp"
#include "strata/distribute/ps_worker_pool.hpp"

namespace strata::distribute::detail {

/// A unit of work on one mini-batch (Model's): worker w's batch, its copy of the variables, its
/// gradient buffer, the loss's denominator, the step, and the hook backward calls between
/// layers (a cancelled mini-batch stops there).
template <class T, class Y>
using PsWork = FunctionRef<UnitWork(int, const ReplicaBatch<Y>&, const T*, T*, double, std::uint64_t,
                                    FunctionRef<void(std::int64_t, std::int64_t)>)>;

/// A server rank: the coordinator's commands until the epoch ends.
template <class P, class T>
class PsServerRank {
public:
    explicit PsServerRank(PsTransport<P, T>& transport) : t_(&transport), remote_(transport.processes()) {}

    void serve_epoch() {
        const int coord = remote_->coordinator_rank();
        auto& srv = t_->servers()[std::size_t(remote_->index())];
        for (;;) {
            const auto m = remote_->receive(coord, "ParameterServer: the coordinator's next command", t_->idle_timeout());
            if (m.kind == ps_msg::kAbort) t_->coordinator_stopped(m);
            if (m.kind == ps_msg::kEnd) return t_->epoch_ended(m);
            if (m.kind == ps_msg::kSendParams) send_shards(srv, m);
            else if (m.kind == ps_msg::kAdmit) take_push(srv, m);
            else if (m.kind == ps_msg::kApply) apply(srv, m);
        }
    }

private:
    static int worker_of(const ParameterServerProcesses::Received& m) {
        std::int64_t w = 0;
        ps_msg::get(m.payload.data(), &w, 1);
        return int(w);
    }
    void send_shards(PsServer<P, T>& srv, const ParameterServerProcesses::Received& m) {
        const auto v = to_vector(srv.params.view());
        remote_->send(remote_->worker_rank(worker_of(m)), ps_msg::kParams, m.step, std::as_bytes(std::span<const T>(v)));
    }
    void take_push(PsServer<P, T>& srv, const ParameterServerProcesses::Received& m) {
        // A worker that died between its report and its push: the update goes on without it
        // (the coordinator finds the worker lost at its next mini-batch).
        std::optional<ParameterServerProcesses::Received> got;
        try {
            got = remote_->receive(remote_->worker_rank(worker_of(m)), "ParameterServer: push", t_->timeout());
        } catch (const DistributedError& e) {
            std::fprintf(stderr, "strata: warning: %s; the update goes on without it\n", e.what());
            return;
        }
        const auto& p = *got;
        STRATA_CHECK(p.kind == ps_msg::kPush && p.step == m.step, DistributedError, "ParameterServer: ", remote_->name(p.source),
                     " pushed mini-batch ", p.step, " (message ", p.kind, "), expected ", m.step);
        if (srv.size == 0) return;
        copy(TensorView<T, place::Host>(reinterpret_cast<T*>(const_cast<std::byte*>(p.payload.data())), Shape{srv.size}),
             srv.next_message().view());
    }
    void apply(PsServer<P, T>& srv, const ParameterServerProcesses::Received& m) {
        T inv{};
        ps_msg::get(m.payload.data(), &inv, 1);
        if (t_->whole_gradient_first()) {
            // The coordinator sums every server's sum of squares and sends the whole back.
            const int coord = remote_->coordinator_rank();
            const double part = srv.reduce_inbox(inv) ? srv.reduced_squares() : 0.0;
            remote_->send(coord, ps_msg::kSquares, m.step, std::as_bytes(std::span<const double>(&part, 1)));
            const auto w = remote_->receive(coord, "ParameterServer: the whole model's sum of squares", t_->idle_timeout());
            if (w.kind == ps_msg::kAbort) t_->coordinator_stopped(w);
            STRATA_CHECK(w.kind == ps_msg::kWhole && w.step == m.step && w.payload.size() == sizeof(double), DistributedError,
                         "ParameterServer: the coordinator sent message ", w.kind, " where the whole sum of squares of update ",
                         m.step, " was expected");
            double whole = 0;
            ps_msg::get(w.payload.data(), &whole, 1);
            srv.apply_reduced(whole);
        } else {
            srv.apply_inbox(inv);
        }
        // A signal here: the coordinator stops the job. Then the loss scale as this update left it.
        const std::int64_t stop = ps_msg::stop_request();
        std::vector<std::byte> ack;
        ps_msg::put(ack, &stop, 1);
        ps_msg::put_loss_scale(ack, srv.opt.loss_scale_state());
        remote_->send(remote_->coordinator_rank(), ps_msg::kAck, m.step, ack);
    }

    PsTransport<P, T>* t_;
    ParameterServerProcesses* remote_;
};

/// A worker rank, on the thread of its worker index: the coordinator's jobs until the epoch ends.
template <class P, class T>
class PsWorkerRank {
public:
    using Received = ParameterServerProcesses::Received;
    PsWorkerRank(PsTransport<P, T>& transport, int w) : t_(&transport), remote_(transport.processes()), w_(w) {}

    template <class Y>
    void work_epoch(PsWork<T, Y> work) {
        const int coord = remote_->coordinator_rank();
        ps_msg::OwnedBatch<Y> ob;
        for (;;) {
            const auto m = remote_->receive(coord, "ParameterServer: the coordinator's next mini-batch", t_->idle_timeout());
            if (m.kind == ps_msg::kEnd) return t_->epoch_ended(m);
            if (m.kind == ps_msg::kAbort) t_->coordinator_stopped(m);
            if (m.kind != ps_msg::kJob) continue;  // a cancellation or decision that came too late
            double divisor = 1;  // the job: the loss's divisor (Job::divisor), then the mini-batch
            ps_msg::get(m.payload.data(), &divisor, 1);
            ob.decode(std::span<const std::byte>(m.payload).subspan(sizeof divisor));
            if (const std::string error = pull(m.step); !error.empty()) {
                remote_->send(coord, ps_msg::kFailed, m.step, ps_msg::text(error));
                continue;
            }
            if (compute(ob, m.step, divisor, work)) await_decision(m.step);
        }
    }

private:
    // Every server's shards for job `step` into this worker's copy; what went wrong otherwise
    // (the coordinator hears why, and names the server).
    std::string pull(std::uint64_t step) {
        auto& wk = t_->workers()[std::size_t(w_)];
        const auto& servers = t_->servers();
        for (int sv = 0; sv < int(servers.size()); ++sv) {
            const auto& srv = servers[std::size_t(sv)];
            for (;;) {  // shards sent for jobs cancelled before they were posted are older: skipped
                Received p;
                try {
                    p = remote_->receive(remote_->server_rank(sv), "ParameterServer: pull reply", t_->timeout());
                } catch (const DistributedError& e) {
                    return e.what();
                }
                if (p.step != step) continue;
                const T* v = reinterpret_cast<const T*>(p.payload.data());
                for (std::size_t i = 0; i < srv.ranges.size(); ++i)
                    copy(TensorView<T, place::Host>(const_cast<T*>(v) + srv.compact[i], Shape{srv.ranges[i].count}),
                         TensorView<T, P>(wk.params.data() + srv.ranges[i].first, Shape{srv.ranges[i].count}));
                break;
            }
        }
        return {};
    }
    // Computes job `step` and reports it: true when it finished (the coordinator then decides),
    // false when it was cancelled or failed (reported as such).
    template <class Y>
    bool compute(const ps_msg::OwnedBatch<Y>& ob, std::uint64_t step, double divisor, PsWork<T, Y> work) {
        const int coord = remote_->coordinator_rank();
        auto& wk = t_->workers()[std::size_t(w_)];
        UnitWork u;
        std::string error;
        bool cancelled = false;
        try {
            u = work(w_, ob.view(), wk.params.data(), wk.grads.data(), divisor, step, [&](std::int64_t, std::int64_t) {
                while (auto c = remote_->try_receive(coord)) {
                    if (c->kind == ps_msg::kAbort) t_->coordinator_stopped(*c);
                    if (c->kind == ps_msg::kCancel && c->step == step) throw Cancelled{};
                }
            });
        } catch (const Cancelled&) {
            cancelled = true;
        } catch (const std::exception& e) {
            error = std::string("worker ") + std::to_string(w_) + ": " + e.what();
        }
        if (cancelled) {
            remote_->send(coord, ps_msg::kCancelled, step, {});
            return false;
        }
        if (!error.empty()) {
            remote_->send(coord, ps_msg::kFailed, step, ps_msg::text(error));
            return false;
        }
        remote_->send(coord, ps_msg::kDone, step, ps_msg::encode_done(u));
        return true;
    }
    // The coordinator's decision on finished job `step`: push its gradient, or discard it.
    void await_decision(std::uint64_t step) {
        const int coord = remote_->coordinator_rank();
        for (;;) {
            const auto d = remote_->receive(coord, "ParameterServer: the coordinator's decision on a mini-batch", t_->idle_timeout());
            if (d.kind == ps_msg::kAbort) t_->coordinator_stopped(d);
            if (d.step != step || d.kind == ps_msg::kCancel) continue;
            if (d.kind == ps_msg::kPushNow) {
                double rescale = 1;  // to the loss scale in force now (PsTransport::push)
                if (d.payload.size() == sizeof rescale) ps_msg::get(d.payload.data(), &rescale, 1);
                push(step, rescale);
            }
            return;  // pushed, or discarded
        }
    }
    void push(std::uint64_t step, double rescale) {
        auto g = to_vector(t_->workers()[std::size_t(w_)].grads.view());
        if (rescale != 1)
            for (auto& x : g) x = T(double(x) * rescale);
        const auto& servers = t_->servers();
        for (int sv = 0; sv < int(servers.size()); ++sv) {
            const auto& srv = servers[std::size_t(sv)];
            std::vector<T> mine(std::size_t(srv.size));
            for (std::size_t i = 0; i < srv.ranges.size(); ++i)
                std::copy_n(g.begin() + srv.ranges[i].first, srv.ranges[i].count, mine.begin() + srv.compact[i]);
            remote_->send(remote_->server_rank(sv), ps_msg::kPush, step, std::as_bytes(std::span<const T>(mine)));
        }
    }

    PsTransport<P, T>* t_;
    ParameterServerProcesses* remote_;
    int w_;
};

}  // namespace strata::distribute::detail
