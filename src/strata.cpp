// strata's compiled part, libstrata: the non-template code of the headers (their impl/*.ipp
// files) compiled once, and the common instantiations of their templates (float and double, the
// host place) that they declare `extern template` in a program built with the compiled part.
// Each header lists its own, once (strata/config.hpp): this file only includes every header that
// has such code, with STRATA_BUILDING_COMPILED_PART defined, which turns the headers' lists into
// the definitions and includes their .ipp files. tests/check_compiled_parts.py checks that none is
// missing. Build it with -DSTRATA_SEPARATE_COMPILATION, as the `strata-compiled` Meson dependency
// and libstrata's pkg-config file do, and link it into a program whose every translation unit
// defines the macro too.
#if !defined(STRATA_SEPARATE_COMPILATION)
#error "src/strata.cpp is strata's compiled part: compile it with -DSTRATA_SEPARATE_COMPILATION"
#endif
#define STRATA_BUILDING_COMPILED_PART 1

#include "strata/core/error.hpp"
#include "strata/core/shape.hpp"
#include "strata/data/dataset.hpp"
#include "strata/data/mnist.hpp"
#include "strata/distribute/collective/all_reduce.hpp"
#include "strata/distribute/collective/async.hpp"
#include "strata/distribute/collective/direct.hpp"
#include "strata/distribute/collective/naive_ring.hpp"
#include "strata/distribute/collective/ring.hpp"
#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/parameter_server.hpp"
#include "strata/distribute/parameter_server_strategy.hpp"
#include "strata/distribute/partitioner.hpp"
#include "strata/distribute/path/mirrored.hpp"
#include "strata/distribute/path/parameter_server.hpp"
#include "strata/distribute/pipeline.hpp"
#include "strata/distribute/pipeline_strategy.hpp"
#include "strata/distribute/rendezvous.hpp"
#include "strata/distribute/replica_pool.hpp"
#include "strata/distribute/straggler.hpp"
#include "strata/distribute/strategy.hpp"
#include "strata/distribute/strategy_classes.hpp"
#include "strata/io/atomic_file.hpp"
#include "strata/io/idx.hpp"
#include "strata/io/json.hpp"
#include "strata/io/safetensors.hpp"
#include "strata/io/svg_plot.hpp"
#include "strata/io/tensorboard.hpp"
#include "strata/io/text.hpp"
#include "strata/loss/losses.hpp"
#include "strata/metrics/accuracy.hpp"
#include "strata/metrics/metric.hpp"
#include "strata/nn/activation.hpp"
#include "strata/nn/initializers.hpp"
#include "strata/nn/sequential.hpp"
#include "strata/optim/optimizers.hpp"
#include "strata/place/devices.hpp"
#include "strata/place/memory.hpp"
#include "strata/tensor/gemm.hpp"
#include "strata/tensor/reduce.hpp"
#include "strata/tensor/tensor.hpp"
#include "strata/train/backup.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/compile_settings.hpp"
#include "strata/train/fit_loop.hpp"
#include "strata/train/model_base.hpp"
#include "strata/train/plot.hpp"
#include "strata/train/tensorboard.hpp"
