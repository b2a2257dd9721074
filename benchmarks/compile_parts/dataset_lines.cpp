// The README's dataset lines alone: load_mnist, from_arrays, shuffle, batch, prefetch.
#include <strata/strata.hpp>
int main() {
    auto mnist = strata::data::load_mnist("data/mnist");
    auto train = strata::data::Dataset<>::from_arrays(mnist.train.images.data, {28, 28, 1}, mnist.train.labels.data)
                     .shuffle(10000, 1).batch(128).prefetch(2);
    auto test = strata::data::Dataset<>::from_arrays(mnist.test.images.data, {28, 28, 1}, mnist.test.labels.data).batch(1000);
    return int(train.cardinality() + test.cardinality()) == 0;
}
