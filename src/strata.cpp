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
#include "strata/distribute/impl/pipeline.ipp"
#include "strata/distribute/impl/rendezvous.ipp"
#include "strata/distribute/impl/replica_pool.ipp"
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
#include "strata/train/impl/plot.ipp"
#include "strata/train/impl/tensorboard.ipp"

namespace strata::train {
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
