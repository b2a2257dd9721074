#pragma once
/// \file strata/distribute/pipeline_mpi.hpp
/// Pipeline stages on separate processes of an MPI job: give the strategy
/// `PipelineOptions::processes = pipeline_processes()` and start R·P processes (mpirun -np R·P,
/// or srun); every process runs the same program and makes the same calls.
///
/// \code
/// namespace sd = strata::distribute;
/// using Strategy = sd::Pipeline<strata::place::Host, sd::OneFOneB, sd::split::Balanced<2>>;
/// Strategy pipeline({.micro_batches = 4, .processes = sd::pipeline_processes()});   // mpirun -np 2
/// strata::Model<Net, Strategy> model(pipeline, 42);
/// \endcode
///
/// Layout: rank q runs stage q % P of replica q / P (the hybrid's replica r is ranks r·P to
/// r·P + P − 1). A job of another size is a ValueError on every rank naming the count expected.
///
/// Transport: activations (forward) and their gradients (backward) are collective::Mailbox
/// messages between neighbouring stages — MPI_Isend, and receives polled against the
/// Pipeline's timeout, which name the stage and rank that did not answer. The sums (the loss
/// and metrics of the last stages over every rank; get_weights' gather; the hybrid's gradients
/// over a stage's R copies, on a sub-communicator of those ranks) are collective::ProcessGroup
/// all-reduces whose deadline is the timeout times the stages (a stall is named by its
/// neighbours first, see receive_from in path/pipeline.hpp). Needs <mpi.h>.
#include <strata/config.hpp>
#include <strata/distribute/collective/process_group.hpp>
#include <strata/distribute/pipeline.hpp>

#include <memory>

namespace strata::distribute {

/// The processes of `comm` as a pipeline's stages (PipelineOptions::processes): the Pipeline
/// joins them when it is built (see the file comment).
STRATA_MPI_DECL std::shared_ptr<PipelineProcesses> pipeline_processes(MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace strata::distribute

#if STRATA_MPI_DEFINITIONS
#include "strata/distribute/impl/pipeline_mpi.ipp"
#endif
