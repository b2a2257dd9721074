// tools/mnist_cnn --strategy parameter_server: the six sync modes in one instantiation, the
// mode, K and B chosen at run time (sync::Any). A translation unit of its own: see mnist_cnn.hpp.
#include "mnist_cnn_ps.hpp"

#include <strata/distribute/launcher.hpp>
#ifdef MNIST_CNN_HAVE_MPI
#include <strata/distribute/parameter_server_mpi.hpp>  // the same job across the processes of mpirun / srun
#endif

namespace mnist_example {

Report train_parameter_server(const Flags& f, const strata::data::Mnist& mnist) {
    namespace sd = strata::distribute;
    auto o = ps_options(f);
#ifdef MNIST_CNN_HAVE_MPI
    // Every process must have the same flags: compared when the processes join (set_job_settings in main()).
    if (sd::launch_info().size > 1) o.processes = sd::parameter_server_processes(f.workers, f.servers, o.timeout);
#endif
    sd::ParameterServer<strata::place::Host, strata::sync::Any> s(f.workers, f.servers, o);
    return train(s, f, mnist);
}

}  // namespace mnist_example
