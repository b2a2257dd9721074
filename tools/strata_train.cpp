// tools/strata_train: a model of tools/strata_train_models.hpp trained with fit on MNIST or
// Fashion-MNIST, under any strategy strata offers, from flags (docs/tools.md).
//
//   build/tools/strata_train --model cnn --dataset fashion_mnist --epochs 3
//   build/tools/strata_train --optimizer sgd --learning-rate 0.05 --momentum 0.9 --strategy mirrored --replicas 2
//   build/tools/strata_train --help          the models, the datasets, every flag and its range
//
// Every model's trainers are compiled in units of their own (tools/meson.build); this unit lists
// them for the driver (strata_train_driver.cpp, shared with tools/mnist_cnn).
#include "strata_train_tool.hpp"

#include <utility>

#ifndef STRATA_TRAIN_MODELS
#error "compile with -DSTRATA_TRAIN_MODELS=NAME,NAME,... (tools/meson.build's strata_train_models)"
#endif
#define STRATA_TRAIN_TEXT_(...) #__VA_ARGS__
#define STRATA_TRAIN_TEXT(...) STRATA_TRAIN_TEXT_(__VA_ARGS__)
static_assert(strata_train::models_are(STRATA_TRAIN_TEXT(STRATA_TRAIN_MODELS)),
              "tools/meson.build's strata_train_models must list the names of tools/strata_train_models.hpp's Models, "
              "in the same order: Meson compiles each model's units from that list");

namespace {
template <class... M>
std::vector<strata_train::ModelEntry> entries(std::tuple<M...>*) {
    return {strata_train::entry<M>()...};
}
}  // namespace

int main(int argc, char** argv) {
    using namespace strata_train;
    const Tool tool{.name = "strata_train",
                    .description = "Trains a model on a dataset with fit, under any strategy.",
                    .models = entries(static_cast<Models*>(nullptr)),
                    .choices = true};
    return run(tool, argc, argv);
}
