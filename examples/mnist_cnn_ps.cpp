// examples/mnist_cnn --strategy parameter_server: the six sync modes in one instantiation, the
// mode, K and B chosen at run time (sync::Any). A translation unit of its own: see mnist_cnn.hpp.
#include "mnist_cnn_ps.hpp"

namespace mnist_example {

Report train_parameter_server(const Flags& f, const strata::data::Mnist& mnist) {
    strata::distribute::ParameterServer<strata::place::Host, strata::sync::Any> s(f.workers, f.servers, ps_options(f));
    return train(s, f, mnist);
}

}  // namespace mnist_example
