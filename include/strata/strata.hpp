#pragma once
/// \file strata/strata.hpp
/// The header most programs include: tensors, layers, losses, optimizers, metrics, datasets
/// and MNIST's IDX files, devices, the in-process strategies (Default, OneDevice, Mirrored,
/// CentralStorage), Model with fit/evaluate/predict, callbacks, checkpoints and backups.
///
/// Compile time is part of the product: the heavy, rarely used parts are opt-in headers, so
/// a program pays only for what it includes (a program that uses them includes them itself):
///   strata/distribute/parameter_server.hpp      ParameterServer, its sync modes, stragglers, partitioners
///   strata/distribute/multi_worker_mirrored.hpp MultiWorkerMirrored (needs MPI)
///   strata/io/svg_plot.hpp, strata/train/plot.hpp       LinePlot, Figure; plot_history
///   strata/io/tensorboard.hpp, strata/train/tensorboard.hpp   event files; the TensorBoard callback
/// Sub-headers stay includable on their own: strata/tensor/tensor_all.hpp (the tensor core),
/// strata/nn/layers.hpp (layers and Sequential), strata/train/model.hpp (Model),
/// strata/io/... (file formats: safetensors, IDX, JSON, the atomic file writer), ...

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
#include "strata/distribute/strategy.hpp"
#include "strata/train/backup.hpp"
#include "strata/train/callbacks.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/interrupt.hpp"
#include "strata/train/model.hpp"
