#pragma once
/// \file strata/fwd.hpp
/// Every primary template and policy tag a user names, declared once, with its default
/// arguments (as Kokkos_Core_fwd.hpp): the places, the sync modes, the layer specs and
/// Sequential, the strategies and their gradient path, and Model. A header that only names
/// these types (a function taking a `Model<Net, Mirrored<>>&`, a trait over strategies)
/// includes this one instead of the definitions; the headers that define them include it too,
/// so the defaults are written here alone (C++ allows a default argument once per template).
///
/// \code
/// #include <strata/fwd.hpp>
/// template <class Net> void train_on(strata::Model<Net, strata::distribute::Mirrored<>>& model);
/// \endcode
///
/// Where each is defined:
///
/// | declared here                                              | defined in                        |
/// |------------------------------------------------------------|-----------------------------------|
/// | `place::Host`, `place::Cuda`                               | place/place.hpp                   |
/// | `StaticShape`, `TensorView`, `Tensor`                      | core/shape.hpp, tensor/tensor.hpp |
/// | `sync::Synchronous`, `KSync`, `KBatchSync`, `KAsync`, `KBatchAsync`, `Asynchronous`, `Any` | distribute/sync.hpp |
/// | `nn::Linear`, `ReLU`, `Sigmoid`, `Tanh`, `Softmax`         | nn/activation.hpp                 |
/// | `nn::Input`                                                | nn/layer.hpp                      |
/// | `nn::Dense`                                                | nn/dense.hpp                      |
/// | `nn::Padding`, `nn::Conv2D`, `nn::Conv2DRect`              | nn/conv2d.hpp (Padding: here)     |
/// | `nn::MaxPooling2D`, `nn::MaxPooling2DRect`                 | nn/max_pooling2d.hpp              |
/// | `nn::AveragePooling2D`, `nn::AveragePooling2DRect`, `nn::GlobalAveragePooling2D` | nn/average_pooling2d.hpp |
/// | `nn::Residual`, `nn::Projection`                           | nn/residual.hpp                   |
/// | `nn::Flatten`, `nn::Dropout`                               | nn/flatten.hpp, nn/dropout.hpp    |
/// | `nn::Embedding`, `nn::EmbeddingOptions` (not declared here: its options are a class type) | nn/embedding.hpp |
/// | `nn::Sequential`, `nn::Network`                            | nn/sequential.hpp                 |
/// | `distribute::Default`, `OneDevice`, `Mirrored`, `CentralStorage` | distribute/strategy.hpp     |
/// | `distribute::MultiWorkerMirrored`                          | distribute/multi_worker_mirrored.hpp (MPI) |
/// | `distribute::ParameterServer`                              | distribute/parameter_server.hpp   |
/// | `distribute::Pipeline`, `GPipe`, `OneFOneB`, `AnySchedule`, `split::ByParams`, `ByFlops`, `At`, `Balanced`, `AnyBalanced` | distribute/pipeline.hpp |
/// | `distribute::TensorParallelDense`, `TensorParallelTokenDense`, `Columns`, `Rows` | distribute/tensor_parallel.hpp |
/// | `distribute::TensorParallelMultiHeadAttention` (not declared here: its options are a class type) | distribute/tensor_parallel_attention.hpp |
/// | `distribute::GradientPath` (the primary template)          | distribute/gradient_path.hpp      |
/// | `Model`                                                    | train/model.hpp                   |
///
/// | `precision::Float32`, `TF32`, `MixedBFloat16`, `MixedFloat16`, `Any` (Model's third argument) | core/precision.hpp |

#include <cstddef>
#include <cstdint>

namespace strata {

namespace place {
struct Host;
struct Cuda;
}  // namespace place

template <std::int64_t... D>
struct StaticShape;
template <class T, class P = place::Host>
class TensorView;
template <class T, class P = place::Host>
class Tensor;

namespace precision {
struct Float32;
struct TF32;
struct MixedBFloat16;
struct MixedFloat16;
struct Any;
}  // namespace precision

namespace sync {
struct Synchronous;
template <int K>
struct KSync;
template <int K>
struct KBatchSync;
template <int K>
struct KAsync;
template <int K>
struct KBatchAsync;
template <int StalenessBound = -1>
struct Asynchronous;
struct Any;
}  // namespace sync

namespace nn {
/// Convolution and pooling padding (Keras's "valid" and "same"). Defined here, not declared,
/// because the layer specs below take `Padding::Valid` as a default.
enum class Padding { Valid, Same };

struct Linear;
struct ReLU;
struct Sigmoid;
struct Tanh;
struct Softmax;

template <std::int64_t... D>
struct Input;
template <std::int64_t Units, class Act = Linear, bool UseBias = true>
struct Dense;
template <std::int64_t Filters, std::int64_t KernelH, std::int64_t KernelW, class Act = Linear, std::int64_t StrideH = 1,
          std::int64_t StrideW = StrideH, Padding Pad = Padding::Valid, bool UseBias = true>
struct Conv2DRect;
template <std::int64_t Filters, std::int64_t Kernel, class Act = Linear, std::int64_t Stride = 1, Padding Pad = Padding::Valid,
          bool UseBias = true>
struct Conv2D;
template <std::int64_t PoolH, std::int64_t PoolW, std::int64_t StrideH = PoolH, std::int64_t StrideW = PoolW,
          Padding Pad = Padding::Valid>
struct MaxPooling2DRect;
template <std::int64_t Pool, std::int64_t Stride = Pool, Padding Pad = Padding::Valid>
struct MaxPooling2D;
template <std::int64_t PoolH, std::int64_t PoolW, std::int64_t StrideH = PoolH, std::int64_t StrideW = PoolW,
          Padding Pad = Padding::Valid>
struct AveragePooling2DRect;
template <std::int64_t Pool, std::int64_t Stride = Pool, Padding Pad = Padding::Valid>
struct AveragePooling2D;
struct GlobalAveragePooling2D;
template <class... Parts>
struct Residual;
template <std::int64_t Filters, std::int64_t Stride = 1, bool UseBias = false>
struct Projection;
struct Flatten;
template <std::int64_t Numerator, std::int64_t Denominator = 100>
struct Dropout;
template <class InputSpec, class... Specs>
struct Sequential;
template <class Seq, class T, class P>
class Network;
}  // namespace nn

namespace distribute {
class Default;
template <class P = place::Host>
class OneDevice;
template <class P = place::Host, class Sync = sync::Synchronous>
class Mirrored;
template <class P = place::Host, class Sync = sync::Synchronous>
class CentralStorage;
template <class P = place::Host, class Sync = sync::Synchronous>
class MultiWorkerMirrored;
template <class P = place::Host, class Sync = sync::Asynchronous<>>
class ParameterServer;

struct GPipe;
struct OneFOneB;
struct AnySchedule;
namespace split {
struct ByParams;
struct ByFlops;
template <std::size_t... Starts>
struct At;
template <int Stages, class Cost = ByParams>
struct Balanced;
template <class Cost = ByParams>
struct AnyBalanced;
}  // namespace split
template <class P = place::Host, class Schedule = GPipe, class Split = split::Balanced<2>>
class Pipeline;

struct Columns;
struct Rows;
template <std::int64_t Units, class Act = nn::Linear, int Shards = 2, class Axis = Columns>
struct TensorParallelDense;
template <std::int64_t Units, class Act = nn::Linear, int Shards = 2, class Axis = Columns>
struct TensorParallelTokenDense;

/// How strategy `Strategy`'s gradients meet its variables, for network `Net` in element type
/// `T`: one specialisation per strategy under distribute/path/.
template <class Strategy, class Net, class T>
class GradientPath;
}  // namespace distribute

/// `Precision`: float or double (every type that one), or a precision policy
/// (strata/core/precision.hpp: variables float, layers computing in the policy's type).
template <class Net, class Strategy = distribute::Default, class Precision = float>
class Model;

}  // namespace strata
