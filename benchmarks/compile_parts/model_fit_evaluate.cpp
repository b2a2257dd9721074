// The README program's model lines: Mirrored, compile, fit, evaluate (the data built as there).
#include "net.hpp"
int main() {
    auto mnist = strata::data::load_mnist("data/mnist");
    auto train = strata::data::Dataset<>::from_arrays(mnist.train.images.data, {28, 28, 1}, mnist.train.labels.data).batch(128);
    auto test = strata::data::Dataset<>::from_arrays(mnist.test.images.data, {28, 28, 1}, mnist.test.labels.data).batch(1000);
    strata::distribute::Mirrored<> s(2);
    strata::Model<Net, strata::distribute::Mirrored<>> model(s, 42);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
    model.fit(train, {.epochs = 1, .validation_data = test});
    return model.evaluate(test).accuracy > 0.5 ? 0 : 1;
}
