#pragma once
// The model one unit of a model's library trains. tools/meson.build compiles each trainer unit
// (strata_train_in_process.cpp, _ps.cpp, _pipeline.cpp, _mw.cpp, _gpu.cu) once per model of
// strata_train_models.hpp, with -DSTRATA_TRAIN_MODEL=NAME; this header turns the name into
// `Model` (its entry in Models) and `Net` (its network), and declares the network's passes
// compiled once, in the model's strata_train_in_process.cpp (docs/building.md, "Compile a
// network once"), so that the model's other units do not compile them again.
#include "strata_train.hpp"

#ifndef STRATA_TRAIN_MODEL
#error "compile this unit with -DSTRATA_TRAIN_MODEL=NAME, NAME a model of tools/strata_train_models.hpp (tools/meson.build does)"
#endif
#define STRATA_TRAIN_TEXT_(x) #x
// Whether the model has a form with synchronized batch normalization (tools/meson.build passes
// -DSTRATA_TRAIN_SYNC_NET=1 for those that do).
#ifndef STRATA_TRAIN_SYNC_NET
#define STRATA_TRAIN_SYNC_NET 0
#endif
#define STRATA_TRAIN_TEXT(x) STRATA_TRAIN_TEXT_(x)
// Whether the model has forms split by tensor parallelism (tools/meson.build passes
// -DSTRATA_TRAIN_TENSOR_PARALLEL=1 for those that do, and compiles strata_train_tensor_parallel.cpp for them).
#ifndef STRATA_TRAIN_TENSOR_PARALLEL
#define STRATA_TRAIN_TENSOR_PARALLEL 0
#endif

namespace strata_train {

inline constexpr std::size_t model_position = model_index(STRATA_TRAIN_TEXT(STRATA_TRAIN_MODEL));
static_assert(model_position < std::tuple_size_v<Models>,
              "-DSTRATA_TRAIN_MODEL names no model of tools/strata_train_models.hpp: tools/meson.build's "
              "strata_train_models must list the names of Models");
using Model = std::tuple_element_t<model_position < std::tuple_size_v<Models> ? model_position : 0, Models>;
using Net = Model::Net;
static_assert(has_sync_net<Model>() == bool(STRATA_TRAIN_SYNC_NET),
              "tools/meson.build's strata_train_sync_models must list exactly the models with a SyncNet");
static_assert(has_tensor_parallel_net<Model>() == bool(STRATA_TRAIN_TENSOR_PARALLEL),
              "tools/meson.build's strata_train_tensor_parallel_models must list exactly the models with tensor_parallel_shards");
#if STRATA_TRAIN_SYNC_NET
/// Its form with synchronized batch normalization (--sync-batch-norm).
using SyncNet = Model::SyncNet;
#endif

}  // namespace strata_train

#ifndef STRATA_TRAIN_DEFINES_NETWORK
extern template class strata::nn::Network<strata_train::Net, float, strata::place::Host>;
#if STRATA_TRAIN_SYNC_NET
extern template class strata::nn::Network<strata_train::SyncNet, float, strata::place::Host>;
#endif
#endif
