// A Model under ParameterServer with the mode chosen at run time (sync::Any), fit and evaluate:
// the parameter server's path, its strategy and the Model around them.
#include "net.hpp"
#include <strata/distribute/parameter_server.hpp>
int main() {
    namespace sd = strata::distribute;
    auto mnist = strata::data::load_mnist("data/mnist");
    auto train = strata::data::Dataset<>::from_arrays(mnist.train.images.data, {28, 28, 1}, mnist.train.labels.data).batch(128);
    sd::ParameterServer<strata::place::Host, strata::sync::Any> s(2, 1, {.rule = strata::sync::Rule::KSync, .k = 1});
    strata::Model<Net, decltype(s)> model(s, 42);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
    model.fit(train, {.epochs = 1});
    return model.evaluate(train).accuracy > 0.5 ? 0 : 1;
}
