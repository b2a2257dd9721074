#pragma once
/// \file strata/strata.hpp
/// The one header a user includes: the whole of strata.
///
/// Sub-headers stay includable on their own for those who care about compile time:
/// strata/tensor/tensor_all.hpp (the tensor core), strata/nn/layers.hpp (layers and
/// Sequential), strata/train/model.hpp (Model and callbacks), strata/distribute/... ,
/// strata/io/... (file formats: safetensors, IDX, JSON, the atomic file writer).
///
/// Opt-in, not included here (a program that uses them includes them itself):
/// strata/io/svg_plot.hpp (LinePlot, Figure), strata/train/plot.hpp (plot_history),
/// strata/io/tensorboard.hpp (event files) and strata/train/tensorboard.hpp (the TensorBoard
/// callback).

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/random.hpp"
#include "strata/core/shape.hpp"
#include "strata/place/place.hpp"
#include "strata/place/threads.hpp"
#include "strata/place/devices.hpp"
#include "strata/tensor/tensor_all.hpp"
#include "strata/nn/layers.hpp"
#include "strata/loss/losses.hpp"
#include "strata/optim/optimizers.hpp"
#include "strata/metrics/accuracy.hpp"
#include "strata/data/dataset.hpp"
#include "strata/io/text.hpp"
#include "strata/io/atomic_file.hpp"
#include "strata/io/json.hpp"
#include "strata/io/safetensors.hpp"
#include "strata/io/idx.hpp"
#include "strata/data/mnist.hpp"
#include "strata/distribute/collective/all_reduce.hpp"
#include "strata/distribute/collective/async.hpp"
#include "strata/distribute/distributed_dataset.hpp"
#include "strata/distribute/partitioner.hpp"
#include "strata/distribute/strategy.hpp"
#include "strata/distribute/straggler.hpp"
#include "strata/distribute/parameter_server.hpp"
#include "strata/train/backup.hpp"
#include "strata/train/callbacks.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/interrupt.hpp"
#include "strata/train/model.hpp"
