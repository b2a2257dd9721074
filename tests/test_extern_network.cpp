// A network whose passes another unit compiles (extern template: docs/building.md, "Compile a
// network once") trains under every path exactly as one device does: the gradient hook that
// starts Mirrored's bucketed all-reduces during backward, CentralStorage, and a pipeline's
// stages (layer ranges of the one compiled network, with their input gradients). That this
// unit holds none of the passes' code is checked on its object by check_extern_network.py
// (the extern_network_symbols test).
#include <doctest/doctest.h>

#include "extern_network.hpp"
#include "test_images.hpp"
#include "test_util.hpp"

#include <cstddef>
#include <vector>

#include <strata/distribute/pipeline.hpp>

namespace dist = strata::distribute;
using extern_network::Cnn;
using strata_test::images;
using strata_test::max_relative_difference;

namespace {

template <class Strategy, class T>
std::vector<T> train_with(Strategy& s, std::size_t global_batch) {
    strata::Model<Cnn, Strategy, T> model(s, 11);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 0.01});
    model.fit(images(global_batch * 3, 5).batch(global_batch), {.epochs = 2, .verbose = 0});
    return model.get_weights();
}

}  // namespace

TEST_CASE("a network compiled in another unit trains under Mirrored, CentralStorage and a Pipeline as on one device") {
    for (std::size_t global : {12u, 10u}) {
        CAPTURE(global);
        dist::OneDevice<> one;
        const auto ref = train_with<dist::OneDevice<>, double>(one, global);
        dist::Mirrored<> bucketed(3, {.bucket_bytes = 64});  // several all-reduces, started by backward's hook
        CHECK(max_relative_difference(train_with<dist::Mirrored<>, double>(bucketed, global), ref) <= 1e-12);
        dist::CentralStorage<> central(2);
        CHECK(max_relative_difference(train_with<dist::CentralStorage<>, double>(central, global), ref) <= 1e-12);
        using Pipe = dist::Pipeline<strata::place::Host, dist::OneFOneB, dist::split::Balanced<3>>;
        Pipe pipeline({.micro_batches = 4, .replicas = 2});
        CHECK(max_relative_difference(train_with<Pipe, double>(pipeline, global), ref) <= 1e-12);
    }
}

TEST_CASE("float: the network compiled in another unit learns (loss falls) and evaluates") {
    dist::OneDevice<> one;
    strata::Model<Cnn, dist::OneDevice<>> model(one, 3);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{.learning_rate = 0.01});
    const auto data = images(120, 7).batch(12);
    const double before = model.evaluate(data).loss;
    model.fit(data, {.epochs = 5, .verbose = 0});
    const double after = model.evaluate(data).loss;
    CAPTURE(before);
    CAPTURE(after);
    CHECK(after < before * 0.9);
}
