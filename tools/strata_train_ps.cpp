// tools/strata_train --strategy parameter_server, for one model (-DSTRATA_TRAIN_MODEL=NAME; see
// strata_train_model.hpp): the six sync modes in one instantiation, the mode, K and B chosen at
// run time (sync::Any). A translation unit of its own: see strata_train.hpp.
#include "strata_train_model.hpp"
#include "strata_train_ps.hpp"

#include <strata/distribute/launcher.hpp>
#ifdef STRATA_TRAIN_HAVE_MPI
#include <strata/distribute/parameter_server_mpi.hpp>  // the same job across the processes of mpirun / srun
#endif

namespace strata_train {

template <class M>
Report train_parameter_server(const Job& job, int& replicas_in_sync) {
    namespace sd = strata::distribute;
    const Flags& f = job.flags;
    auto o = ps_options(f);
#ifdef STRATA_TRAIN_HAVE_MPI
    // Every process must have the same flags: compared when the processes join (set_job_settings in run()).
    if (sd::launch_info().size > 1) o.processes = sd::parameter_server_processes(f.workers, f.servers, o.timeout);
#endif
    sd::ParameterServer<strata::place::Host, strata::sync::Any> s(f.workers, f.servers, o);
    replicas_in_sync = f.workers;
    return train<typename M::Net>(s, job);
}
template Report train_parameter_server<Model>(const Job&, int&);

}  // namespace strata_train
