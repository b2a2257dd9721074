// The seed CNN's network alone, forward and backward: its layers' kernels, specialised on the
// network's shapes, are compiled in the unit that uses them.
#include "net.hpp"
int main() {
    strata::nn::Network<Net, float, strata::place::Host> net;
    std::vector<float> p(Net::num_params), g(Net::num_params), x(128 * 784);
    net.init(p.data(), 1);
    net.reserve(128, true);
    const strata::nn::Mode mode{.training = true};
    net.forward(p.data(), strata::TensorView<float, strata::place::Host>(x.data(), strata::Shape{128, 28, 28, 1}), mode);
    net.backward(p.data(), g.data(), mode);
    return g[0] > 0;
}
