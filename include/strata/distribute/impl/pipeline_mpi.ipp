#pragma once
/// \file strata/distribute/impl/pipeline_mpi.ipp
/// The definitions behind strata/distribute/pipeline_mpi.hpp (pipeline_processes() and the class
/// it makes, detail::MpiPipelineProcesses): included by it in the header-only mode, compiled once
/// in src/strata_mpi.cpp under STRATA_SEPARATE_COMPILATION_MPI.

#include "strata/distribute/pipeline_mpi.hpp"
#include "strata/distribute/collective/mailbox.hpp"
#include "strata/distribute/collective/process_group.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::distribute {

namespace detail {
class MpiPipelineProcesses final : public PipelineProcesses {
public:
    explicit MpiPipelineProcesses(MPI_Comm comm) : comm_(comm) {
        collective::mpi::ensure_initialized();
        MPI_Comm_rank(comm, &rank_);
        MPI_Comm_size(comm, &size_);
        job_ = collective::mpi::world_ranks(comm);  // for the messages (name, job_rank)
    }

    void join(int stages, int replicas, std::chrono::milliseconds timeout, collective::Settings settings) override {
        // The settings first (every rank's stages, replicas and the program's among them), so
        // that a rank started with other flags is refused on every rank naming them, rather
        // than by the count below on that rank alone while the others wait for it.
        // The sums over every rank wait the timeout times the stages: a rank that reaches one
        // early (stage 0 after an inference's forward pass, a stage whose micro-batches are done)
        // waits while a stall elsewhere is named first by the stalled stage's own neighbour,
        // whose receive waits up to the timeout times the stages on that side.
        collective::ProcessGroupOptions o{.timeout = timeout * stages, .settings = std::move(settings)};
        all_ = std::make_unique<collective::ProcessGroup>(comm_, 1, o);
        STRATA_CHECK(size_ == stages * replicas, ValueError, "Pipeline across processes: ", replicas, " replica(s) × ", stages,
                     " stages need ", stages * replicas, " processes (mpirun -np ", stages * replicas,
                     "; rank q runs stage q % ", stages, " of replica q / ", stages, "), but the job has ", size_);
        stages_ = stages;
        replicas_ = replicas;
        box_ = std::make_unique<collective::Mailbox>(comm_, timeout, [this](int q) { return name(q); });
        if (stages > 1) {
            // The P stages of this rank's replica (every rank is known to be here: the split
            // cannot wait forever).
            MPI_Comm line;
            MPI_Comm_split(comm_, rank_ / stages, rank_ % stages, &line);
            collective::ProcessGroupOptions lo = o;
            lo.settings = {};
            stages_group_ = std::make_unique<collective::ProcessGroup>(line, 1, lo);
            MPI_Comm_free(&line);
        }
        if (replicas > 1) {
            // Every rank is known to be here (the group joined): the split cannot wait forever.
            MPI_Comm copies;
            MPI_Comm_split(comm_, rank_ % stages, rank_ / stages, &copies);
            o.settings = {};  // a copy waits the same: a stall anywhere in its pipeline is named first
            copies_ = std::make_unique<collective::ProcessGroup>(copies, 1, o);
            MPI_Comm_free(&copies);
        }
    }
    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name(int q) const override {
        return "stage " + std::to_string(q % stages_) + (replicas_ > 1 ? " of replica " + std::to_string(q / stages_) : std::string()) +
               " (rank " + std::to_string(job_rank(q)) + ")";
    }
    int job_rank(int q) const override { return q >= 0 && q < size_ ? job_[std::size_t(q)] : q; }
    void send(int q, std::uint32_t kind, std::uint64_t step, std::span<const std::byte> payload) override {
        box_->send(q, kind, step, payload);
    }
    Received receive(int q, std::string_view what, std::chrono::milliseconds timeout) override {
        auto m = box_->receive(q, what, timeout);
        return Received{m.kind, m.step, std::move(m.payload)};
    }
    void sum_all(std::span<double> v) override { all_->all_reduce(0, v, collective::ReduceOp::Sum, SyncPoint{"all_reduce", "Pipeline: sum over the stages"}); }
    void sum_all(std::span<float> v) override { all_->all_reduce(0, v, collective::ReduceOp::Sum, SyncPoint{"all_reduce", "Pipeline: sum over the stages"}); }
    void sum_copies(std::span<double> v) override { sum_over_copies(v); }
    void sum_copies(std::span<float> v) override { sum_over_copies(v); }
    void sum_stages(std::span<double> v) override {
        if (stages_group_)
            stages_group_->all_reduce(0, v, collective::ReduceOp::Sum, SyncPoint{"all_reduce", "Pipeline: a step's sum over the stages"});
    }
    void barrier() override { all_->barrier(0, SyncPoint{"barrier", "Pipeline"}); }
    void agree(const collective::Settings& settings, std::string_view what) override { all_->agree(settings, what); }
    void fail(std::string_view why) noexcept override {
        collective::mpi::job_failed() = true;  // MPI_Finalize would wait for ranks that may be gone
        if (all_) all_->abort(why);
        if (copies_) copies_->abort(why);
        if (stages_group_) stages_group_->abort(why);
    }

private:
    template <class T>
    void sum_over_copies(std::span<T> v) {
        if (copies_) copies_->all_reduce(0, v, collective::ReduceOp::Sum, SyncPoint{"all_reduce", "Pipeline: a stage's gradients over its copies"});
    }

    MPI_Comm comm_;
    int rank_ = 0, size_ = 1, stages_ = 1, replicas_ = 1;
    std::vector<int> job_;  // the MPI_COMM_WORLD rank of each of comm_'s
    std::unique_ptr<collective::ProcessGroup> all_, copies_, stages_group_;
    std::unique_ptr<collective::Mailbox> box_;
};
}  // namespace detail

STRATA_MPI_DECL std::shared_ptr<PipelineProcesses> pipeline_processes(MPI_Comm comm) {
    return std::make_shared<detail::MpiPipelineProcesses>(comm);
}

}  // namespace strata::distribute
