#pragma once
// What a training program's main() needs: the models it offers, each with its trainers (one
// per kind of strategy, compiled in the model's own units), and run(), the driver
// (strata_train_driver.cpp: flags, data, report). Light on purpose: the programs' main units
// (strata_train.cpp, mnist_cnn.cpp) include it and the models' list, not the library's
// umbrella. The units that train include strata_train.hpp, which defines Job and Report.
#include "strata_train_models.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata_train {

struct Job;     // what the driver hands a trainer (strata_train.hpp)
struct Report;  // what a trainer hands back (strata_train.hpp)

/// A trainer: trains one model under the strategy the job's flags name and reports;
/// `replicas_in_sync` gets the replicas (or workers) it trained with.
using Trainer = Report (*)(const Job&, int& replicas_in_sync);

// The trainers of model M, each explicitly instantiated in its unit of M's library
// (tools/meson.build compiles those units once per model, -DSTRATA_TRAIN_MODEL=NAME):
/// --strategy one_device, mirrored or central_storage (strata_train_in_process.cpp).
template <class M>
Report train_in_process(const Job& job, int& replicas_in_sync);
/// --strategy parameter_server (strata_train_ps.cpp): one instantiation for every sync mode.
template <class M>
Report train_parameter_server(const Job& job, int& replicas_in_sync);
/// --strategy pipeline or hybrid (strata_train_pipeline.cpp).
template <class M>
Report train_pipeline(const Job& job, int& replicas_in_sync);
/// --strategy multi_worker_mirrored (strata_train_mw.cpp, where MPI is found).
template <class M>
Report train_multi_worker(const Job& job, int& replicas_in_sync);
/// --tensor-parallel N (strata_train_tensor_parallel.cpp, for the models with a split form).
template <class M>
Report train_tensor_parallel(const Job& job, int& replicas_in_sync);
/// --device gpu (strata_train_gpu.cu, where nvcc is found).
template <class M>
Report train_on_gpu(const Job& job, int& replicas_in_sync);

/// One model of a program, as the driver sees it.
struct ModelEntry {
    std::string_view name, description;
    std::int64_t num_params = 0;
    std::size_t num_layers = 0;
    std::string (*summary)() = nullptr;  // the Keras-like table printed before training
    Trainer in_process = nullptr, parameter_server = nullptr, pipeline = nullptr;
    Trainer multi_worker = nullptr;  // null where the build has no MPI
    Trainer gpu = nullptr;           // null where the build has no CUDA, or the model no GPU kernels (on_gpu)
    Recipe recipe{};                 // the flags' defaults for it
    std::int64_t num_non_trainable = 0;  // batch normalization's moving statistics
    bool has_sync_net = false;       // a form with synchronized batch normalization (--sync-batch-norm)
    Trainer tensor_parallel = nullptr;  // null where the model has no split form (--tensor-parallel)
    std::vector<int> tensor_parallel_shards{};  // the shard counts --tensor-parallel takes for it
};

/// Model M's entry: its facts and its trainers.
template <class M>
ModelEntry entry() {
    using Net = typename M::Net;
    ModelEntry e{M::name, M::description, Net::num_params, Net::num_layers, &Net::summary,
                 &train_in_process<M>, &train_parameter_server<M>, &train_pipeline<M>};
    e.recipe = recipe_of<M>();
    e.num_non_trainable = Net::num_non_trainable();
    e.has_sync_net = has_sync_net<M>();
    if constexpr (has_tensor_parallel_net<M>()) {
        e.tensor_parallel = &train_tensor_parallel<M>;
        e.tensor_parallel_shards.assign(M::tensor_parallel_shards.begin(), M::tensor_parallel_shards.end());
    }
#ifdef STRATA_TRAIN_HAVE_MPI
    e.multi_worker = &train_multi_worker<M>;
#endif
#ifdef STRATA_TRAIN_HAVE_CUDA
    if constexpr (on_gpu<M>()) e.gpu = &train_on_gpu<M>;
#endif
    return e;
}

/// A training program: strata_train (every model, every dataset, the optimizer flags) or
/// mnist_cnn (the first model on the first dataset with RMSprop(1e-3); its flags, table and JSON
/// as they have always been).
struct Tool {
    std::string_view name;         // the program's name in its messages
    std::string_view description;  // --help's first line
    std::vector<ModelEntry> models;  // --model's choices, the first the default
    bool choices = false;            // --model, --dataset, --optimizer, --learning-rate, --momentum
};

/// Parses the command line and trains: the program's exit status (cli::run's conventions:
/// 2 for a usage error, 1 for a failure).
int run(const Tool& tool, int argc, char** argv);

}  // namespace strata_train
