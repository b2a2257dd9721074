#pragma once
/// \file strata/distribute/impl/parameter_server_mpi.ipp
/// The definitions behind strata/distribute/parameter_server_mpi.hpp (parameter_server_processes()
/// and the class it makes, detail::MpiParameterServerProcesses): included by it in the
/// header-only mode, compiled once in src/strata_mpi.cpp under STRATA_SEPARATE_COMPILATION_MPI.

#include "strata/distribute/parameter_server_mpi.hpp"
#include "strata/distribute/collective/mailbox.hpp"
#include "strata/distribute/collective/process_group.hpp"
#include "strata/distribute/parameter_server_layout.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace strata::distribute {

namespace detail {
class MpiParameterServerProcesses final : public ParameterServerProcesses {
public:
    // First the ranks join (collective::ProcessGroup: every rank within the timeout, with the
    // same workers, servers and timeout, or a ValueError on every rank naming who has what);
    // only then is the job's size checked against the layout, alike on every rank.
    MpiParameterServerProcesses(int workers, int servers, MPI_Comm comm, std::chrono::milliseconds timeout)
        : group_(comm, 1, group_options(workers, servers, timeout)),
          layout_(ParameterServerLayout::of(group_.size(), workers, servers)), rank_(group_.rank()),
          box_(comm, timeout, [layout = layout_](int r) { return layout.name(r); }) {}
    Role role() const override {
        switch (layout_.role(rank_)) {
            case ParameterServerLayout::Role::Coordinator: return Role::Coordinator;
            case ParameterServerLayout::Role::Server: return Role::Server;
            case ParameterServerLayout::Role::Worker: return Role::Worker;
        }
        return Role::Coordinator;
    }
    int index() const override { return layout_.index(rank_); }
    int coordinator_rank() const override { return ParameterServerLayout::coordinator_rank(); }
    int server_rank(int s) const override { return layout_.server_rank(s); }
    int worker_rank(int w) const override { return layout_.worker_rank(w); }
    int processes() const override { return layout_.processes(); }
    std::string name(int rank) const override { return layout_.name(rank); }
    void send(int rank, std::uint32_t kind, std::uint64_t step, std::span<const std::byte> payload) override {
        box_.send(rank, kind, step, payload);
    }
    Received receive(int rank, std::string_view what, std::chrono::milliseconds timeout) override {
        try {
            auto m = box_.receive(rank, what, timeout);
            return Received{m.source, m.kind, m.step, std::move(m.payload)};
        } catch (const DistributedError&) {
            collective::mpi::job_failed() = true;  // a rank is gone: MPI_Finalize would wait for it
            throw;
        }
    }
    std::optional<Received> try_receive(int rank) override {
        auto m = box_.try_receive(rank);
        if (!m) return std::nullopt;
        return Received{m->source, m->kind, m->step, std::move(m->payload)};
    }

    // MPI_Finalize waits for every rank: a job that lost one skips it (as a failed process group does).
    void mark_lost(int) override { collective::mpi::job_failed() = true; }  // -1: the job failed

    void agree(const collective::Settings& settings, std::string_view what) override { group_.agree(settings, what); }

private:
    static collective::ProcessGroupOptions group_options(int workers, int servers, std::chrono::milliseconds timeout) {
        collective::ProcessGroupOptions o;
        o.timeout = timeout;
        o.transport = collective::Transport::Mpi;  // agree() only: no shared window
        o.fake_hosts = 0;
        // No host layout to fake (its messages go point to point over MPI): a value set for it
        // would be ignored without a word, so it is refused, after the one parser has read it.
        if (const int h = collective::ProcessGroup::fake_hosts_from_environment(); h > 0)
            throw_error<ValueError>("ParameterServer across processes: STRATA_FAKE_HOSTS=", h,
                                    " declares a host layout, which the parameter server does not use (its messages go point "
                                    "to point over MPI, whatever the hosts): unset it (it is for MultiWorkerMirrored's "
                                    "hierarchical transport and the pipeline's process groups)");
        o.settings = {{"strategy", "ParameterServer"}, {"workers", std::to_string(workers)}, {"servers", std::to_string(servers)}};
        return o;
    }

    collective::ProcessGroup group_;  // the settings' comparisons (join, agree())
    ParameterServerLayout layout_;
    int rank_;
    collective::Mailbox box_;
};
}  // namespace detail

STRATA_MPI_DECL std::shared_ptr<ParameterServerProcesses> parameter_server_processes(int workers, int servers,
                                                                                     std::chrono::milliseconds timeout, MPI_Comm comm) {
    return std::make_shared<detail::MpiParameterServerProcesses>(workers, servers, comm, timeout);
}

}  // namespace strata::distribute
