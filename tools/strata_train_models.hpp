#pragma once
// The models tools/strata_train trains (--model NAME) and the datasets it trains them on
// (--dataset NAME): the one header to edit to offer another. tools/mnist_cnn is strata_train
// with --model cnn --dataset mnist fixed.
//
// Adding a model (docs/tools.md, "Adding a model"):
//   1. Here: a struct with `name` (what --model takes), `description` (one line for --help) and
//      `Net` (a strata::nn::Sequential taking Input<28, 28, 1> and ending in Dense<10, Softmax>,
//      as every dataset below is), and its name appended to `Models`. A model whose layers have
//      no CUDA kernels yet also says `static constexpr bool on_gpu = false;` (--device gpu then
//      refuses it, auto trains it on the CPU, and the GPU unit compiles nothing for it).
//   2. tools/meson.build: the same name appended to `strata_train_models`, in the same order
//      (strata_train.cpp refuses to compile, saying so, when the two lists differ). Meson then
//      compiles the model's units (strategies, parameter server, pipeline, MultiWorkerMirrored,
//      GPU) as a library of their own, side by side with the other models'.
// Nothing else: the flags, the report, every strategy and --help come from these two lists.
#include <strata/nn/layers.hpp>

#include "mnist_cnn_net.hpp"  // the seed CNN (the benchmarks include it alone)

#include <array>
#include <cstddef>
#include <string_view>
#include <cstdint>
#include <tuple>

namespace strata_train {

/// What a model trains with when no flag says otherwise (a model without one: the flags'
/// defaults, mnist_cnn's).
struct Recipe {
    int epochs = 6;
    std::string_view optimizer = "rmsprop";
    double learning_rate = 0;   // 0: the optimizer's default
    double weight_decay = 0.004;
    std::string_view lr_schedule = "constant";
    double warmup_epochs = 0;
    bool augment = false;
    int augment_pad = 2;  // with augment: zero padding before the random crop
};

/// The seed CNN: the network tools/mnist_cnn has always trained.
struct Cnn {
    static constexpr std::string_view name = "cnn";
    static constexpr std::string_view description =
        "the seed CNN, mnist_cnn's: Conv2D 32, MaxPooling2D, Conv2D 64, MaxPooling2D, Dense 64, Dense 10";
    using Net = mnist_example::Net;
};


/// A small residual network for 28x28 images (ResNet-8-like: a stem and one residual block a
/// stage, He et al. 2016's CIFAR layout at widths 16, 32, 64), with batch normalization:
///   stem     Conv2D 16 3x3 (no bias) -> BatchNormalization -> ReLU                    28x28x16
///   stage 1  Residual[Conv 16 -> BN -> ReLU -> Conv 16 -> BN] + x, ReLU               28x28x16
///   stage 2  Residual[Conv 32 /2 -> BN -> ReLU -> Conv 32 -> BN] + 1x1 Conv 32 /2, ReLU  14x14x32
///   stage 3  Residual[Conv 64 /2 -> BN -> ReLU -> Conv 64 -> BN] + 1x1 Conv 64 /2, ReLU    7x7x64
///   GlobalAveragePooling2D -> Dense 10 softmax
/// 78 042 variables (77 562 trained, 480 moving statistics); 9.4 M multiply-adds a 28x28 image
/// forward (docs/second_model.md counts them). `Norm` is the batch normalization: plain, or
/// synchronized across replicas (--sync-batch-norm).
template <class Norm>
struct ResNetOf {
    template <std::int64_t F, std::int64_t S>
    using Conv = strata::nn::Conv2D<F, 3, strata::nn::Linear, S, strata::nn::Padding::Same, false>;
    using Relu = strata::nn::ActivationLayer<strata::nn::ReLU>;
    template <std::int64_t F>
    using Identity = strata::nn::Residual<Conv<F, 1>, Norm, Relu, Conv<F, 1>, Norm, strata::nn::ReLU>;
    template <std::int64_t F>
    using Down = strata::nn::Residual<strata::nn::Projection<F, 2>, Conv<F, 2>, Norm, Relu, Conv<F, 1>, Norm, strata::nn::ReLU>;
    using Net = strata::nn::Sequential<strata::nn::Input<28, 28, 1>, Conv<16, 1>, Norm, Relu, Identity<16>, Down<32>, Down<64>,
                                       strata::nn::GlobalAveragePooling2D, strata::nn::Dense<10, strata::nn::Softmax>>;
};

/// The small residual network (ResNetOf above) and its recipe: what `--model resnet` trains with
/// when no flag says otherwise (docs/second_model.md measured it). SyncNet is the same network
/// with synchronized batch normalization (--sync-batch-norm), for the strategies whose replicas
/// step together.
struct ResNet {
    static constexpr std::string_view name = "resnet";
    static constexpr std::string_view description =
        "a small ResNet (16-32-64, a residual block a stage) with batch normalization, 78k variables";
    // Momentum 0.9 (PyTorch's default, 0.1 there): Keras's 0.99 averages over ~100 steps, which
    // lag the weights early in a short run.
    using Net = ResNetOf<strata::nn::BatchNormalization<strata::nn::BatchNormOptions{.momentum = 0.9}>>::Net;
    using SyncNet = ResNetOf<strata::nn::SyncBatchNormalization<0.9>>::Net;
    // The peak rate 4e-3, weight decay 0.01 and padding by 1 pixel: of the four recipes measured
    // on Fashion-MNIST (docs/benchmarks.md, "Your second model"), the one that reached 93%.
    static constexpr Recipe recipe{.epochs = 15, .optimizer = "adamw", .learning_rate = 4e-3, .weight_decay = 0.01,
                                   .lr_schedule = "cosine", .warmup_epochs = 1, .augment = true, .augment_pad = 1};
};

/// A Vision Transformer for 28x28 images (Dosovitskiy et al., "An image is worth 16x16 words",
/// ICLR 2021), pre-norm, with a learned position embedding and mean pooling in place of the
/// class token (Beyer et al., "Better plain ViT baselines for ImageNet-1k", 2022):
///   PatchEmbedding 4x4 -> 64                                   49 tokens x 64
///   PositionEmbedding (49 x 64, learned)
///   4 x [Residual[LayerNorm -> MultiHeadAttention 4 heads of 16] + x,
///        Residual[LayerNorm -> TokenDense 128 GELU -> TokenDense 64] + x]
///   LayerNormalization -> GlobalAveragePooling1D -> Dense 10 softmax
/// 138 890 variables; 7.7 M multiply-adds a 28x28 image forward (docs/tools.md counts them).
/// Every layer is place-generic (Conv2D's, LayerNormalization's, MultiHeadAttention's and
/// Dense's kernels; the embeddings' and the pooling's passes are for_each_n and sum), so it
/// also builds for the GPU.
struct ViT {
    static constexpr std::int64_t patch = 4, width = 64, depth = 4, heads = 4, mlp = 128;
    // The network with its attention layer and its MLP's two layers as parameters: the plain
    // layers (Net), or the same split over devices (TensorParallelNet).
    template <class Attend, class Up, class Down>
    struct With {
        using Attention = strata::nn::Residual<strata::nn::LayerNormalization<>, Attend>;
        using Mlp = strata::nn::Residual<strata::nn::LayerNormalization<>, Up, Down>;
        using Net = strata::nn::Sequential<strata::nn::Input<28, 28, 1>, strata::nn::PatchEmbedding<patch, width>,
                                           strata::nn::PositionEmbedding<>, Attention, Mlp, Attention, Mlp, Attention, Mlp,
                                           Attention, Mlp, strata::nn::LayerNormalization<>, strata::nn::GlobalAveragePooling1D,
                                           strata::nn::Dense<10, strata::nn::Softmax>>;
    };
    using Net = typename With<strata::nn::MultiHeadAttention<heads, width / heads>, strata::nn::TokenDense<mlp, strata::nn::GELU>,
                              strata::nn::TokenDense<width>>::Net;
    /// --tensor-parallel N, for each N here: With<> of the split layers (strata_train_tensor_parallel.cpp
    /// makes it; each N divides the 4 heads and the MLP's 128 features).
    static constexpr std::array<int, 2> tensor_parallel_shards{2, 4};
    static constexpr std::string_view name = "vit";
    static constexpr std::string_view description =
        "a Vision Transformer: patch 4 (49 tokens), width 64, depth 4, 4 heads, MLP 128 GELU, mean pooling, 139k variables";
    // AdamW with weight decay 0.05 and a cosine decay after a linear warm-up: the recipe of the
    // small ViTs trained from scratch (DeiT, Touvron et al. 2021: AdamW, wd 0.05, cosine, warm-up);
    // the peak rate 1e-3 for batch 128 and no augmentation (docs/tools.md: what it reached).
    static constexpr Recipe recipe{.epochs = 10, .optimizer = "adamw", .learning_rate = 1e-3, .weight_decay = 0.05,
                                   .lr_schedule = "cosine", .warmup_epochs = 1, .augment = false};
};

/// Every model strata_train offers, in the order --help lists them. The first is the default.
using Models = std::tuple<Cnn, ResNet, ViT>;

/// Model M's recipe (the flags' defaults where it has none).
template <class M>
constexpr Recipe recipe_of() {
    if constexpr (requires { M::recipe; }) return M::recipe;
    else return Recipe{};
}
/// Whether model M has a form with synchronized batch normalization (`SyncNet`).
template <class M>
constexpr bool has_sync_net() {
    return requires { typename M::SyncNet; };
}

/// Whether model M has forms split over devices by tensor parallelism (--tensor-parallel N for
/// each N of its `tensor_parallel_shards`): a transformer whose `With<Attention, Up, Down>`
/// takes its attention layer and its MLP's two layers, which strata_train_tensor_parallel.cpp
/// replaces with Megatron's split forms.
template <class M>
constexpr bool has_tensor_parallel_net() {
    return requires { M::tensor_parallel_shards; };
}

/// Whether model M trains on the GPU (--device gpu): unless it says `on_gpu = false`.
template <class M>
constexpr bool on_gpu() {
    if constexpr (requires { M::on_gpu; }) return M::on_gpu;
    else return true;
}

/// A dataset of 28x28 grey images in 10 classes, in MNIST's four IDX files.
struct Dataset {
    std::string_view name;         // what --dataset takes
    std::string_view title;        // the report's name for it
    std::string_view default_dir;  // --data when not given
    std::string_view fetch;        // the script that puts the files there
    std::string_view description;  // one line for --help
    std::array<std::string_view, 10> classes;
};

/// Every dataset strata_train offers, in the order --help lists them; the first is the default.
/// Fashion-MNIST has MNIST's format, and strata_train_driver.cpp's load_dataset() reads both
/// with strata::data::load_mnist (the place for a dataset's own loader).
inline constexpr std::array<Dataset, 2> datasets = {{
    {"mnist", "MNIST", "data/mnist", "scripts/fetch-mnist", "LeCun's handwritten digits: 60000 training, 10000 test images",
     {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}},
    {"fashion_mnist", "Fashion-MNIST", "data/fashion_mnist", "scripts/fetch-fashion-mnist",
     "Zalando's clothing images, MNIST's format and sizes",
     {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"}},
}};

namespace detail {
template <class... M>
constexpr std::array<std::string_view, sizeof...(M)> names_of(std::tuple<M...>*) {
    return {M::name...};
}
}  // namespace detail

/// The models' names, in Models' order.
inline constexpr auto model_names = detail::names_of(static_cast<Models*>(nullptr));

/// The position of the model called `name` in Models (Models' size when there is none).
constexpr std::size_t model_index(std::string_view name) {
    std::size_t i = 0;
    while (i < model_names.size() && model_names[i] != name) ++i;
    return i;
}

/// Whether `list` ("cnn,resnet": tools/meson.build's strata_train_models) names Models' models,
/// in their order.
constexpr bool models_are(std::string_view list) {
    for (const std::string_view name : model_names) {
        const std::size_t end = list.find(',');
        if (list.substr(0, end) != name) return false;
        list = end == std::string_view::npos ? std::string_view() : list.substr(end + 1);
    }
    return list.empty();
}

}  // namespace strata_train
