// strata's compiled part: the non-template code of the headers that have an impl/*.ipp, compiled
// once, and the instantiations the headers declare `extern template` for under
// STRATA_SEPARATE_COMPILATION (strata/config.hpp). Build it with -DSTRATA_SEPARATE_COMPILATION,
// as the `strata-compiled` Meson dependency and libstrata's pkg-config file do, and link it into
// a program whose every translation unit defines the macro too.
#if !defined(STRATA_SEPARATE_COMPILATION)
#error "src/strata.cpp is strata's compiled part: compile it with -DSTRATA_SEPARATE_COMPILATION"
#endif

#include "strata/distribute/collective/direct.hpp"
#include "strata/distribute/collective/naive_ring.hpp"
#include "strata/distribute/collective/ring.hpp"
#include "strata/distribute/strategy.hpp"
#include "strata/data/dataset.hpp"
#include "strata/data/impl/mnist.ipp"
#include "strata/distribute/collective/impl/all_reduce.ipp"
#include "strata/distribute/collective/impl/async.ipp"
#include "strata/distribute/impl/gradient_path.ipp"
#include "strata/distribute/impl/parameter_server.ipp"
#include "strata/distribute/impl/partitioner.ipp"
#include "strata/distribute/impl/pipeline.ipp"
#include "strata/distribute/impl/rendezvous.ipp"
#include "strata/distribute/impl/replica_pool.ipp"
#include "strata/distribute/impl/straggler.ipp"
#include "strata/io/impl/atomic_file.ipp"
#include "strata/io/impl/idx.ipp"
#include "strata/io/impl/json.ipp"
#include "strata/io/impl/safetensors.ipp"
#include "strata/io/impl/svg_plot.ipp"
#include "strata/io/impl/tensorboard.ipp"
#include "strata/io/impl/text.ipp"
#include "strata/place/impl/devices.ipp"
#include "strata/train/impl/checkpoint.ipp"
#include "strata/train/impl/compile_settings.ipp"
#include "strata/train/impl/fit_loop.ipp"
#include "strata/train/impl/model_base.ipp"
#include "strata/train/impl/plot.ipp"
#include "strata/train/impl/tensorboard.ipp"

namespace strata::train {
template class ModelBase<float>;
template class ModelBase<double>;
template CheckpointData<float> read_checkpoint<float>(const std::filesystem::path&, const CheckpointSpec&);
template CheckpointData<double> read_checkpoint<double>(const std::filesystem::path&, const CheckpointSpec&);
}  // namespace strata::train

namespace strata::distribute::collective {
template void ring_all_reduce<float>(const Exchange<float>&, ReduceOp);
template void ring_all_reduce<double>(const Exchange<double>&, ReduceOp);
template void naive_ring_all_reduce<float>(const Exchange<float>&, ReduceOp);
template void naive_ring_all_reduce<double>(const Exchange<double>&, ReduceOp);
template void direct_all_reduce<float>(const Exchange<float>&, ReduceOp);
template void direct_all_reduce<double>(const Exchange<double>&, ReduceOp);
template void direct_gather_slices<float>(const Exchange<float>&);
template void direct_gather_slices<double>(const Exchange<double>&);
template void ReplicaGroup::broadcast<float>(int, std::span<float>, int);
template void ReplicaGroup::broadcast<double>(int, std::span<double>, int);
template void ReplicaGroup::all_reduce_impl<float>(int, std::span<float>, ReduceOp, Algorithm, std::int64_t);
template void ReplicaGroup::all_reduce_impl<double>(int, std::span<double>, ReduceOp, Algorithm, std::int64_t);
template void ReplicaGroup::hierarchical_all_reduce<float>(int, std::span<float>, ReduceOp, std::int64_t);
template void ReplicaGroup::hierarchical_all_reduce<double>(int, std::span<double>, ReduceOp, std::int64_t);
}  // namespace strata::distribute::collective

namespace strata::distribute::detail {
template class ReplicaRuntime<place::Host>;
template class ParameterServerCore<place::Host, float>;
template class ParameterServerCore<place::Host, double>;
template void ParameterServerCore<place::Host, float>::epoch_run<std::int32_t>(ParameterServerCore<place::Host, float>::Next<std::int32_t>,
                                                                              std::uint64_t&,
                                                                              ParameterServerCore<place::Host, float>::Work<std::int32_t>,
                                                                              ParameterServerCore<place::Host, float>::OnStep);
template class MirroredCopies<Mirrored<place::Host, sync::Synchronous>, float>;
template class MirroredCopies<Mirrored<place::Host, sync::Synchronous>, double>;
template class LockstepBuffers<Default, float>;
template class LockstepBuffers<Default, double>;
template class LockstepBuffers<OneDevice<place::Host>, float>;
template class LockstepBuffers<OneDevice<place::Host>, double>;
template class LockstepBuffers<Mirrored<place::Host, sync::Synchronous>, float>;
template class LockstepBuffers<Mirrored<place::Host, sync::Synchronous>, double>;
template class LockstepBuffers<CentralStorage<place::Host, sync::Synchronous>, float>;
template class LockstepBuffers<CentralStorage<place::Host, sync::Synchronous>, double>;
}  // namespace strata::distribute::detail

namespace strata::io {
template IdxArray<float> read_idx<float>(const std::filesystem::path&);
template IdxArray<std::int32_t> read_idx<std::int32_t>(const std::filesystem::path&);
template IdxArray<std::uint8_t> read_idx<std::uint8_t>(const std::filesystem::path&);
}  // namespace strata::io

namespace strata::data {
template class Dataset<std::int32_t>;
template class detail::ds::SourceStage<std::int32_t>;
template class detail::ds::SourceNode<std::int32_t>;
template class detail::ds::ShuffleStage<std::int32_t>;
template class detail::ds::ShuffleNode<std::int32_t>;
template class detail::ds::BatchStage<std::int32_t>;
template class detail::ds::BatchNode<std::int32_t>;
template class detail::ds::RepeatStage<std::int32_t>;
template class detail::ds::RepeatNode<std::int32_t>;
template class detail::ds::MapStage<std::int32_t>;
template class detail::ds::MapNode<std::int32_t>;
template class detail::ds::CacheStage<std::int32_t>;
template class detail::ds::CacheNode<std::int32_t>;
template class detail::ds::TakeStage<std::int32_t>;
template class detail::ds::TakeNode<std::int32_t>;
template class detail::ds::PrefetchStage<std::int32_t>;
template class detail::ds::PrefetchNode<std::int32_t>;
}  // namespace strata::data

// --- The element-type code of the host place (issue 20, compile time) -----------------------
// What a program's units would otherwise instantiate and optimise for float and double on
// place::Host whatever their network: the headers declare these `extern template` (and define
// the members out of their classes, not inline, so that GCC does not instantiate them for
// inlining), and the non-template code of the .ipp files below.
#include "strata/core/impl/error.ipp"
#include "strata/place/impl/memory.ipp"
#include "strata/nn/impl/sequential.ipp"
#include "strata/tensor/impl/gemm.ipp"
#include "strata/train/impl/backup.ipp"
#include "strata/distribute/gradient_path.hpp"
#include "strata/loss/losses.hpp"
#include "strata/metrics/accuracy.hpp"
#include "strata/metrics/metric.hpp"
#include "strata/nn/activation.hpp"
#include "strata/nn/initializers.hpp"
#include "strata/optim/optimizers.hpp"
#include "strata/tensor/gemm.hpp"
#include "strata/tensor/reduce.hpp"

namespace strata {
namespace detail {
template void throw_joined<Error>(std::initializer_list<MessagePiece>);
template void throw_joined<ShapeError>(std::initializer_list<MessagePiece>);
template void throw_joined<ValueError>(std::initializer_list<MessagePiece>);
template void throw_joined<IoError>(std::initializer_list<MessagePiece>);
template void throw_joined<DeviceError>(std::initializer_list<MessagePiece>);
template void throw_joined<DistributedError>(std::initializer_list<MessagePiece>);
template void throw_joined<CheckpointError>(std::initializer_list<MessagePiece>);
template void throw_joined<NumericError>(std::initializer_list<MessagePiece>);
template std::string stream_text<Shape>(const Shape&);
template void host_gemm<float>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, float, const float*, int, const float*, int, float, float*, int);
template void host_gemm<double>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, double, const double*, int, const double*, int, double, double*, int);
template void reduce_axis_impl<float, place::Host>(const TensorView<float, place::Host>&, int, const TensorView<float, place::Host>&, Reduction, const char*);
template void reduce_axis_impl<double, place::Host>(const TensorView<double, place::Host>&, int, const TensorView<double, place::Host>&, Reduction, const char*);
}  // namespace detail
template void Tensor<float, place::Host>::resize(const Shape&);
template void Tensor<float, place::Host>::release() noexcept;
template void Tensor<double, place::Host>::resize(const Shape&);
template void Tensor<double, place::Host>::release() noexcept;
template void Tensor<std::int32_t, place::Host>::resize(const Shape&);
template void Tensor<std::int32_t, place::Host>::release() noexcept;
template void gemm<float, place::Host>(Trans, Trans, float, const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, float, const TensorView<float, place::Host>&);
template double sum<float, place::Host>(const TensorView<float, place::Host>&);
template void softmax<float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&);
template void gemm<double, place::Host>(Trans, Trans, double, const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, double, const TensorView<double, place::Host>&);
template double sum<double, place::Host>(const TensorView<double, place::Host>&);
template void softmax<double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&);
}  // namespace strata

namespace strata::optim {
template class OptimizerState<float, place::Host>;
template class OptimizerState<double, place::Host>;
}  // namespace strata::optim

namespace strata::distribute::detail {
template struct OptimizerCopies<float, place::Host>;
template struct OptimizerCopies<double, place::Host>;
}  // namespace strata::distribute::detail

namespace strata::loss {
template double loss_and_grad<float, place::Host>(const Loss&, const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, double, Input, const float*);
template double loss_and_grad<double, place::Host>(const Loss&, const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, double, Input, const double*);
}  // namespace strata::loss

namespace strata::metrics {
template std::int64_t count_correct<float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, AccuracyKind);
template std::int64_t count_in_top_k<float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, int);
template Counts count_binary<float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&);
template std::int64_t count_correct<double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, AccuracyKind);
template std::int64_t count_in_top_k<double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, int);
template Counts count_binary<double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&);
}  // namespace strata::metrics

namespace strata::nn {
template void glorot_uniform<float, place::Host>(float*, std::int64_t, std::int64_t, std::int64_t, std::uint64_t, std::uint64_t);
template void zeros<float, place::Host>(float*, std::int64_t);
template void glorot_uniform<double, place::Host>(double*, std::int64_t, std::int64_t, std::int64_t, std::uint64_t, std::uint64_t);
template void zeros<double, place::Host>(double*, std::int64_t);
template void bias_activation<Linear, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
template void bias_activation<ReLU, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
template void bias_activation<Sigmoid, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
template void bias_activation<Tanh, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
template void bias_activation<Softmax, float, place::Host>(const TensorView<float, place::Host>&, const float*, std::int64_t, bool);
template void bias_activation<Linear, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
template void bias_activation<ReLU, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
template void bias_activation<Sigmoid, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
template void bias_activation<Tanh, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
template void bias_activation<Softmax, double, place::Host>(const TensorView<double, place::Host>&, const double*, std::int64_t, bool);
template void activation_backward<Linear, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
template void activation_backward<ReLU, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
template void activation_backward<Sigmoid, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
template void activation_backward<Tanh, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
template void activation_backward<Softmax, float, place::Host>(const TensorView<float, place::Host>&, const TensorView<float, place::Host>&, bool);
template void activation_backward<Linear, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
template void activation_backward<ReLU, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
template void activation_backward<Sigmoid, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
template void activation_backward<Tanh, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
template void activation_backward<Softmax, double, place::Host>(const TensorView<double, place::Host>&, const TensorView<double, place::Host>&, bool);
}  // namespace strata::nn
