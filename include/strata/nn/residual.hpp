#pragma once
/// \file strata/nn/residual.hpp
/// `Residual<Parts...>`: a residual block (He, Zhang, Ren, Sun, "Deep residual learning for image
/// recognition", CVPR 2016) written as one layer spec of a Sequential:
///
///     y = act(f(x) + shortcut(x))
///
/// where f, the *residual branch*, is a chain of layer specs, the shortcut is the identity or a
/// `Projection<Filters, Stride>` (a strided 1×1 convolution, for a branch that changes the
/// shape), and act is an optional activation applied after the add (Linear by default):
///
/// \code
/// using namespace strata::nn;
/// using Net = Sequential<Input<8, 8, 2>, Conv2D<4, 3, ReLU, 1, Padding::Same>,
///                        // identity shortcut, ReLU after the add (ResNet v1's basic block)
///                        Residual<Conv2D<4, 3, ReLU, 1, Padding::Same>, Conv2D<4, 3, Linear, 1, Padding::Same>, ReLU>,
///                        // projection shortcut: 8 channels, stride 2, as the branch
///                        Residual<Projection<8, 2>, Conv2D<8, 3, ReLU, 2, Padding::Same>,
///                                 Conv2D<8, 3, Linear, 1, Padding::Same>, ReLU>,
///                        GlobalAveragePooling2D, Dense<10, Softmax>>;
/// \endcode
///
/// The parts, in this order:
/// - optionally first, `Projection<Filters, Stride = 1, UseBias = false>`: the shortcut is
///   Keras's `Conv2D(Filters, 1, strides=Stride, use_bias=UseBias)` with no activation, instead
///   of the identity. No bias by default: the branch's last layer (a biased convolution, or a
///   batch normalisation) already adds one per channel to the same sum, so a second would be a
///   redundant parameter; ResNets, whose shortcut is followed by batch normalisation, leave it out.
/// - the layers of the residual branch, at least one: any layer specs, a Residual included.
/// - optionally last, an activation tag (`ReLU`, `Tanh`, `Sigmoid`, `Linear`): applied after the
///   add, as Keras's `Activation(...)` after `Add()`. Softmax is refused (it is not elementwise).
///
/// Shapes are checked at compile time: with the identity shortcut the branch must give back
/// its input's shape; with a projection, the projection's output shape must be the branch's.
/// Otherwise the model does not compile, with `ResidualShapeError<Block, Branch, BranchShape,
/// Shortcut, ShortcutShape>` and a sentence in the message.
///
/// Parameters: the projection's (when there is one), then each branch layer's, in order, in the
/// block's block of the flat buffer. `param_info()` names them Keras-like inside the block:
/// "projection/kernel", "conv2d/kernel", "conv2d/bias", "conv2d_1/kernel", ... (the branch's
/// layers numbered among themselves); a Sequential prefixes the block's own name:
/// "residual_1/conv2d/kernel". Every other field of an inner layer's ParamInfo is passed on as
/// the layer gives it.
///
/// Random streams: inner layer k (the projection first, then the branch's layers) is
/// initialised, and a random layer draws, with `inner_stream(s, k)`, a 64-bit hash of the
/// block's stream s and k (splitmix64) made odd: never one of the streams a Network gives its
/// own layers (layer index × 16), and different for every (block, k), so that two identical
/// blocks in a row start from different parameters. (Dropout keys its masks on the stream's 23
/// low bits: there two inner Dropout layers collide with probability 2^-22, and never with a
/// Network layer's, the low bit being set.)
///
/// Buffers: the block owns each inner layer's output and output gradient (and, with a
/// projection, the branch's input gradient), sized to the batch on the first pass with that
/// batch size and reused after: no allocation in steady state. `reserve(n, training)` sizes and
/// touches them ahead (Network::reserve).

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/detail/dependent_false.hpp"
#include "strata/nn/activation.hpp"
#include "strata/nn/conv2d.hpp"
#include "strata/nn/layer.hpp"
#include "strata/nn/sequential.hpp"

namespace strata::nn {

/// The residual branch of a `Residual` block, as ResidualShapeError names it: its layer specs.
template <class... Layers>
struct ResidualBranch {};
/// The identity shortcut, as ResidualShapeError names it.
struct IdentityShortcut {};

/// Fails with a message naming the block, its residual branch and the branch's output shape,
/// and the shortcut and the shortcut's output shape (they appear in the instantiation the
/// compiler prints: ResidualShapeError<Block, Branch, BranchShape, Shortcut, ShortcutShape>).
template <class Block, class Branch, class BranchShape, class Shortcut, class ShortcutShape, bool Ok>
struct ResidualShapeError {
    static_assert(Ok, "strata::nn::Residual: the residual branch and the shortcut give different shapes, so they cannot "
                      "be added; the block, the residual branch, the branch's output shape, the shortcut and the "
                      "shortcut's output shape are the template arguments of ResidualShapeError<Block, Branch, "
                      "BranchShape, Shortcut, ShortcutShape> (in the instantiation the compiler prints with this error)");
    static constexpr bool value = Ok;
};

namespace detail {
template <class In, class T, class P>
struct ProjectionOutsideResidual {
    static_assert(strata::detail::dependent_false<In>,
                  "strata::nn::Projection is the shortcut of a residual block, not a layer of its own: write "
                  "Residual<Projection<Filters, Stride>, Layers...>");
    using input_shape = In;
    using output_shape = In;
    static constexpr std::int64_t num_params = 0;
    static std::vector<ParamInfo> param_info() { return {}; }
    void init(T*, std::uint64_t, std::uint64_t) {}
    void forward(const T*, const TensorView<T, P>&, const TensorView<T, P>&, const Mode&) {}
    void backward(const T*, T*, const TensorView<T, P>&, const TensorView<T, P>&, const TensorView<T, P>&,
                  const TensorView<T, P>&, const Mode&) {}
};
}  // namespace detail

/// The projection shortcut of a residual block: Keras's `Conv2D(Filters, 1, strides=Stride,
/// use_bias=UseBias)`, no activation, Glorot-uniform kernel [1, 1, cin, Filters] (and a zero
/// bias with UseBias). Only as the first part of a `Residual` (see the top of this file, also
/// for why there is no bias by default). Its output is [ceil(h / Stride), ceil(w / Stride),
/// Filters]: what a branch of "same" convolutions with total stride Stride gives.
template <std::int64_t Filters, std::int64_t Stride, bool UseBias>
struct Projection {
    static_assert(Filters >= 1, "strata::nn::Projection<Filters, Stride>: Filters must be >= 1");
    static_assert(Stride >= 1, "strata::nn::Projection<Filters, Stride>: Stride must be >= 1");
    static constexpr const char* name = "Projection";
    static constexpr const char* keras_name = "projection";
    static constexpr std::int64_t filters = Filters, stride = Stride;
    static constexpr bool use_bias = UseBias;
    /// The convolution it is.
    using conv = Conv2D<Filters, 1, Linear, Stride, Padding::Valid, UseBias>;
    template <class In, class T, class P>
    using bind = detail::ProjectionOutsideResidual<In, T, P>;
};

namespace detail {

template <class S>
inline constexpr bool is_projection_v = false;
template <std::int64_t F, std::int64_t S, bool B>
inline constexpr bool is_projection_v<Projection<F, S, B>> = true;
/// An activation tag (not a layer spec): what may close a Residual's parts.
template <class S>
inline constexpr bool is_activation_tag_v = Activation<S> && !LayerSpec<S>;

template <bool Ok, std::size_t I, class Tuple, class Else>
struct element_or {
    using type = Else;
};
template <std::size_t I, class Tuple, class Else>
struct element_or<true, I, Tuple, Else> {
    using type = std::tuple_element_t<I, Tuple>;
};

/// The parts of Residual<Parts...> sorted out: the shortcut (a Projection or IdentityShortcut),
/// the branch (ResidualBranch<Layers...>) and the activation after the add (Linear if none).
template <class... Parts>
struct ResidualParts {
    static constexpr std::size_t count = sizeof...(Parts);
    using all = std::tuple<Parts...>;
    static constexpr bool projected = count > 0 && is_projection_v<typename element_or<(count > 0), 0, all, void>::type>;
    static constexpr bool activated =
        count > 0 && is_activation_tag_v<typename element_or<(count > 0), count - 1, all, void>::type>;
    static constexpr std::size_t first = projected ? 1 : 0;
    static constexpr std::size_t branch_size = count - first - (activated ? 1 : 0);
    template <std::size_t... I>
    static auto branch_of(std::index_sequence<I...>) -> ResidualBranch<std::tuple_element_t<first + I, all>...>;
    using branch = decltype(branch_of(std::make_index_sequence<branch_size>{}));
    using shortcut = typename element_or<projected, 0, all, IdentityShortcut>::type;
    using activation = typename element_or<activated, count - 1, all, Linear>::type;
    /// Every branch part is a layer spec (no Projection or activation tag in the middle).
    static constexpr bool branch_ok = [] {
        if constexpr (branch_size == 0) return true;
        else
            return []<std::size_t... I>(std::index_sequence<I...>) {
                return ((!is_projection_v<std::tuple_element_t<first + I, all>> &&
                         !is_activation_tag_v<std::tuple_element_t<first + I, all>>) &&
                        ...);
            }(std::make_index_sequence<branch_size>{});
    }();
    static constexpr bool activation_ok = [] {
        if constexpr (activated) return !activation::rowwise && !grad_needs_input_v<activation>;
        else return true;
    }();
    static constexpr bool ok = branch_size >= 1 && branch_ok && activation_ok;
};

template <class Spec, class In, class T, class P>
class ResidualImpl;

/// A layer that draws random numbers: it has a `set_stream` (as Dropout).
template <class L>
inline constexpr bool draws_random_v = requires(L& layer) { layer.set_stream(std::uint64_t(0)); };

/// splitmix64's finaliser (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
/// OOPSLA 2014): a bijection of 64-bit words that mixes every bit into every other.
constexpr std::uint64_t splitmix64(std::uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

}  // namespace detail

/// The random stream of inner layer `k` of a residual block whose stream is `block`: a hash of
/// the pair, made odd so that it is never a Network layer's stream (a multiple of 16), also in
/// the low bits Dropout keeps.
constexpr std::uint64_t inner_stream(std::uint64_t block, std::size_t k) {
    return detail::splitmix64(detail::splitmix64(block) + std::uint64_t(k) + 1) | 1u;
}

/// A residual block (see the top of this file): `Residual<[Projection<F, S>,] Layers... [, Act]>`.
///
/// Requires: at least one branch layer; a Projection only first and an activation only last
/// (and not Softmax); the shapes of the branch and the shortcut equal (with a projection, the
/// block's input is an image). Otherwise the model does not compile, with a sentence saying
/// which.
/// Ensures: output shape = the branch's; y = act(f(x) + shortcut(x)); the gradient reaches x
/// through both paths (dx = dx_branch + dx_shortcut).
template <class... Parts>
struct Residual {
    using parts = detail::ResidualParts<Parts...>;
    static_assert(parts::branch_size >= 1,
                  "strata::nn::Residual<...>: give at least one layer for the residual branch, e.g. "
                  "Residual<Conv2D<16, 3, ReLU, 1, Padding::Same>, Conv2D<16, 3, Linear, 1, Padding::Same>>");
    static_assert(parts::branch_ok,
                  "strata::nn::Residual<...>: a Projection<...> shortcut comes first and the activation applied after "
                  "the add comes last; the parts between them are the residual branch's layer specs");
    static_assert(parts::activation_ok,
                  "strata::nn::Residual<..., Act>: the activation after the add must be elementwise with a derivative "
                  "taken from its output (ReLU, Tanh, Sigmoid, Linear), not Softmax; GELU (its derivative needs the sum, "
                  "which the block does not keep) goes in an ActivationLayer<GELU> after the block");
    static constexpr const char* name = "Residual";
    static constexpr const char* keras_name = "residual";
    /// Projection<...> or IdentityShortcut.
    using shortcut = typename parts::shortcut;
    /// ResidualBranch<Layers...>.
    using branch = typename parts::branch;
    /// The activation applied after the add (Linear when none is given).
    using activation_after_add = typename parts::activation;
    template <class In, class T, class P>
    using bind = std::conditional_t<parts::ok, detail::ResidualImpl<Residual, In, T, P>, detail::InvalidLayer<In, T, P>>;
};

namespace detail {

// y = act(a + b), elementwise (one thread per value on a GPU).
template <class T, class Act>
struct AddActivate {
    const T* a;
    const T* b;
    T* y;
    bool apply;
    template <class I>
    STRATA_HD void operator()(I i) const {
        const T s = a[i] + b[i];
        y[i] = apply ? Act::apply(s) : s;
    }
};
// d += s, elementwise.
template <class T>
struct AddInto {
    T* d;
    const T* s;
    template <class I>
    STRATA_HD void operator()(I i) const {
        d[i] += s[i];
    }
};

template <class Branch>
struct BranchOf;
template <class... L>
struct BranchOf<ResidualBranch<L...>> {
    template <class In, class T, class P>
    using chain = BindChain<In, T, P, L...>;
    /// The branch's layers' Keras names, numbered among themselves: conv2d, conv2d_1, ...
    static std::vector<std::string> names() {
        static constexpr const char* kinds[] = {spec_keras_name<L>()...};
        return keras_layer_names(kinds);
    }
};

// The projection's bound layer: a 1×1 Conv2D, bound only on an image (the block reports a
// wrong rank itself).
template <bool Bind, class Shortcut, class In, class T, class P>
struct ProjectionLayer {
    using type = std::tuple<>;
};
template <class Shortcut, class In, class T, class P>
struct ProjectionLayer<true, Shortcut, In, T, P> {
    using type = std::tuple<typename CheckedLayer<typename Shortcut::conv, In, T, P>::type>;
};

/// The bound residual block (see strata/nn/layer.hpp for the contract, the top of this file
/// for what it computes).
template <class Spec, class In, class T, class P>
class ResidualImpl {
    using Parts = typename Spec::parts;
    using Act = typename Parts::activation;
    using Shortcut = typename Parts::shortcut;
    using Names = BranchOf<typename Parts::branch>;
    using Chain = typename Names::template chain<In, T, P>;
    using BranchShape = typename Chain::output_shape;
    static constexpr bool projected = Parts::projected;
    static constexpr bool image = In::rank == 3;
    static_assert(LayerShapeError<Spec, AnyShapeOfRank<3>, In, !projected || image>::value,
                  "strata::nn::Residual: a Projection shortcut is a strided 1x1 Conv2D: the block's input must be an "
                  "image, rank 3 per example (height, width, channels)");
    using ProjectionTuple = typename ProjectionLayer<projected && image, Shortcut, In, T, P>::type;
    // The inner layers: the projection (if any) first, then the branch's.
    using Inner = decltype(std::tuple_cat(std::declval<ProjectionTuple>(), std::declval<typename Chain::type>()));
    static constexpr std::size_t first_branch = std::tuple_size_v<ProjectionTuple>;
    static constexpr std::size_t num_inner = std::tuple_size_v<Inner>;
    static constexpr std::size_t branch_size = num_inner - first_branch;
    static constexpr TokenMask inner_token_mask = []<std::size_t... K>(std::index_sequence<K...>) {
        return !projected && ((token_mask_use<std::tuple_element_t<K, Inner>>() == TokenMask::Passes) && ...) ? TokenMask::Passes
                                                                                                           : TokenMask::Unsupported;
    }(std::make_index_sequence<num_inner>{});
    template <std::size_t K>
    using inner_t = std::tuple_element_t<K, Inner>;
    using ShortcutShape = std::conditional_t<(first_branch > 0), typename inner_t<0>::output_shape, In>;
    static_assert(ResidualShapeError<Spec, typename Parts::branch, BranchShape, IdentityShortcut, In,
                                     projected || std::is_same_v<BranchShape, In>>::value,
                  "strata::nn::Residual: the residual branch must give back its input's shape, which the identity "
                  "shortcut adds to it: keep the extents (stride 1, Padding::Same) and the channel count, or give the "
                  "block a Projection<Filters, Stride> shortcut");
    static_assert(ResidualShapeError<Spec, typename Parts::branch, BranchShape, Shortcut, ShortcutShape,
                                     !projected || !image || std::is_same_v<BranchShape, ShortcutShape>>::value,
                  "strata::nn::Residual: the Projection shortcut must give the residual branch's output shape: set "
                  "Projection<Filters, Stride> to the branch's output channels and total stride");

public:
    using input_shape = In;
    using output_shape = BranchShape;
    /// The bound inner layers, the projection (if any) first (for tools that walk a network:
    /// benchmarks/step_profile counts their FLOPs).
    using inner_layers = Inner;
    /// Carries the token mask when every inner layer does (nn::TokenMask).
    static constexpr TokenMask token_mask = inner_token_mask;
    static constexpr auto offsets = param_offsets<Inner>(std::make_index_sequence<num_inner>{});
    static constexpr std::int64_t num_params = offsets[num_inner];

    /// The inner layers' parameters, each ParamInfo as the layer gives it but for its name
    /// (prefixed with the inner layer's name) and offset (moved to the layer's place in the block).
    static std::vector<ParamInfo> param_info() {
        const std::vector<std::string> names = inner_names();
        std::vector<ParamInfo> all;
        [&]<std::size_t... K>(std::index_sequence<K...>) {
            (
                [&] {
                    for (ParamInfo p : inner_t<K>::param_info()) {
                        p.name = names[K] + "/" + p.name;
                        p.offset += offsets[K];
                        all.push_back(std::move(p));
                    }
                }(),
                ...);
        }(std::make_index_sequence<num_inner>{});
        return all;
    }
    /// The inner layers' names inside the block: "projection" (when there is one), then the
    /// branch's Keras names.
    static std::vector<std::string> inner_names() {
        std::vector<std::string> names;
        if constexpr (first_branch > 0) names.push_back(Shortcut::keras_name);
        for (auto& n : Names::names()) names.push_back(std::move(n));
        return names;
    }

    /// Each inner layer's parameters from its own stream, inner_stream(stream, k).
    void init(T* params, std::uint64_t seed, std::uint64_t stream) {
        stream_ = stream;
        [&]<std::size_t... K>(std::index_sequence<K...>) {
            (std::get<K>(inner_).init(params + offsets[K], seed, inner_stream(stream, K)), ...);
        }(std::make_index_sequence<num_inner>{});
    }

    // ---- the optional members a Network calls, forwarded to the inner layers that have them --

    /// Whether an inner layer draws random numbers (has a `set_stream`, as Dropout).
    static constexpr bool draws_random = []<std::size_t... K>(std::index_sequence<K...>) {
        return (draws_random_v<inner_t<K>> || ...);
    }(std::make_index_sequence<num_inner>{});

    /// Whether an inner layer combines statistics over replicas (synchronized batch
    /// normalization): a strategy whose replicas do not step together refuses the model.
    static constexpr bool synchronizes_replicas = []<std::size_t... K>(std::index_sequence<K...>) {
        return (synchronizes_replicas_v<inner_t<K>> || ...);
    }(std::make_index_sequence<num_inner>{});

    /// Whether an inner layer's passes read values back to the host (batch normalization): a
    /// step through the block is then not captured as a CUDA graph.
    static constexpr bool host_round_trips = []<std::size_t... K>(std::index_sequence<K...>) {
        return ([] {
            if constexpr (requires { inner_t<K>::host_round_trips; }) return bool(inner_t<K>::host_round_trips);
            else return false;
        }() || ...);
    }(std::make_index_sequence<num_inner>{});

    /// A replica with an empty share joins its inner layers' sums over replicas, in the order a
    /// pass makes them (Network::join_empty): forward's from the first inner layer on,
    /// backward's from the last (the projection, which is visited first in backward, has none).
    void join_forward(const T* params, const Mode& mode)
        requires synchronizes_replicas
    {
        on_inner([&](auto& layer, std::size_t k) -> decltype(layer.join_forward(params, mode)) {
            layer.join_forward(params + offsets[k], mode);
        });
    }
    void join_backward(T* grads, const Mode& mode)
        requires synchronizes_replicas
    {
        [&]<std::size_t... J>(std::index_sequence<J...>) {
            (join_backward_inner<num_inner - 1 - J>(grads, mode), ...);
        }(std::make_index_sequence<num_inner>{});
    }

    /// Sets the block's stream; each inner layer with a `set_stream` (Dropout) gets
    /// inner_stream(stream, k). Only a block with such a layer has it: a Model takes a layer
    /// with `set_stream` for one that draws random numbers (whose steps are never replayed as a
    /// CUDA graph).
    void set_stream(std::uint64_t stream)
        requires draws_random
    {
        stream_ = stream;
        on_inner([&](auto& layer, std::size_t k) -> decltype(layer.set_stream(stream)) {
            layer.set_stream(inner_stream(stream, k));
        });
    }
    std::uint64_t stream() const { return stream_; }

    /// Sizes and touches the inner buffers for batches of `n` (the gradients too with
    /// `training`), then lets each inner layer with a `reserve` size its own workspaces.
    void reserve(std::int64_t n, bool training) {
        prepare(n);
        for (std::size_t k = 0; k < num_inner; ++k) {
            touch(out_[k]);
            if (training) touch(dout_[k]);
        }
        if (training) touch(dx_branch_);
        on_inner([&](auto& layer, std::size_t) -> decltype(layer.reserve(n, training)) { layer.reserve(n, training); });
    }

    /// Introduces the branch's neighbouring layers to each other (nn::link_neighbours).
    ResidualImpl() {
        [&]<std::size_t... K>(std::index_sequence<K...>) {
            (link_neighbours(std::get<first_branch + K>(inner_), std::get<first_branch + K + 1>(inner_)), ...);
        }(std::make_index_sequence<(branch_size > 0 ? branch_size - 1 : 0)>{});
    }

    /// The inner layers (the projection first, when there is one).
    Inner& layers() { return inner_; }

    // ---- the passes ---------------------------------------------------------------------------

    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const Mode& mode) {
        const std::int64_t n = x.dim(0);
        prepare(n);
        Mode inner = mode;
        inner.skip_activation = false;
        if constexpr (first_branch > 0) std::get<0>(inner_).forward(params + offsets[0], x, out_[0].view(), inner);
        [&]<std::size_t... J>(std::index_sequence<J...>) {
            (forward_inner<first_branch + J>(params, J == 0 ? x : out_[first_branch + J - (J > 0)].view(), inner), ...);
        }(std::make_index_sequence<branch_size>{});
        const T* shortcut = first_branch > 0 ? out_[0].data() : x.data();
        const bool apply = !mode.skip_activation && !std::is_same_v<Act, Linear>;
        for_each_index<P>(y.size(), AddActivate<T, Act>{out_[num_inner - 1].data(), shortcut, y.data(), apply});
        forward_of_ = x.data();
        forward_batch_ = n;
    }

    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& y,
                  const TensorView<T, P>& dy, const TensorView<T, P>& dx, const Mode& mode) {
        // The inner outputs are those of the forward pass on this input; recompute them if another
        // input went through the block since.
        if (forward_of_ != x.data() || forward_batch_ != x.dim(0)) forward(params, x, y, mode);
        Mode inner = mode;
        inner.skip_activation = false;
        activation_backward<Act>(y, dy, mode.skip_activation);  // through the activation after the add (in place)
        const bool want_dx = !dx.empty();
        // The gradient of the sum goes to both paths. The branch's layers may overwrite their
        // output gradient, so the branch gets a copy of it when the shortcut still needs it.
        TensorView<T, P> branch_dy = dy;
        if (first_branch > 0 || want_dx) {
            branch_dy = dout_[num_inner - 1].view();
            place::copy_n<P>(dy.data(), dy.size(), branch_dy.data());
        }
        // The shortcut's input gradient goes to dx (the identity's is dy itself, added below).
        if constexpr (first_branch > 0)
            std::get<0>(inner_).backward(params + offsets[0], grads + offsets[0], x, out_[0].view(), dy,
                                         want_dx ? dx : TensorView<T, P>(), inner);
        // The branch, last layer first; its input gradient goes to dx (identity shortcut) or to
        // dx_branch_ (projection), and the shortcut's is added to it.
        const TensorView<T, P> branch_dx = !want_dx ? TensorView<T, P>() : first_branch > 0 ? dx_branch_.view() : dx;
        [&]<std::size_t... J>(std::index_sequence<J...>) {
            (backward_inner<first_branch + (branch_size - 1 - J)>(params, grads, x, branch_dy, branch_dx, inner), ...);
        }(std::make_index_sequence<branch_size>{});
        if (want_dx) for_each_index<P>(dx.size(), AddInto<T>{dx.data(), first_branch > 0 ? dx_branch_.data() : dy.data()});
    }

private:
    /// The one place the inner layers are visited, the projection first: calls f(layer, k) on
    /// each inner layer k for which that call is well formed. Forwarding another optional member
    /// of the layers (one a Network calls only on a layer that has it) is one line:
    ///     on_inner([&](auto& layer, std::size_t k) -> decltype(layer.hook(a)) { layer.hook(a); });
    template <class F>
    void on_inner(F&& f) {
        [&]<std::size_t... K>(std::index_sequence<K...>) {
            (
                [&] {
                    auto& layer = std::get<K>(inner_);
                    if constexpr (std::is_invocable_v<F&, decltype(layer), std::size_t>) f(layer, K);
                }(),
                ...);
        }(std::make_index_sequence<num_inner>{});
    }

    template <std::size_t K>
    void join_backward_inner(T* grads, const Mode& mode) {
        auto& layer = std::get<K>(inner_);
        if constexpr (requires { layer.join_backward(grads, mode); }) layer.join_backward(grads + offsets[K], mode);
    }

    // Inner layer K's forward from `in` into its output buffer. A layer that only views its input
    // another way (aliases_input: Flatten) gets a copy, since the block owns its buffers.
    template <std::size_t K>
    void forward_inner(const T* params, const TensorView<T, P>& in, const Mode& mode) {
        if constexpr (aliases_input<inner_t<K>>())
            place::copy_n<P>(in.data(), in.size(), out_[K].data());
        else
            std::get<K>(inner_).forward(params + offsets[K], in, out_[K].view(), mode);
    }

    // Inner layer K's backward: its output gradient is `last_dy` for the branch's last layer,
    // else its own buffer; its input gradient goes to `first_dx` for the branch's first layer,
    // else to the previous layer's output-gradient buffer.
    template <std::size_t K>
    void backward_inner(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& last_dy,
                        const TensorView<T, P>& first_dx, const Mode& mode) {
        const TensorView<T, P> in = K == first_branch ? x : out_[K - (K > 0)].view();
        const TensorView<T, P> dy = K + 1 == num_inner ? last_dy : dout_[K].view();
        const TensorView<T, P> dx = K == first_branch ? first_dx : dout_[K - (K > 0)].view();
        if constexpr (aliases_input<inner_t<K>>()) {
            if (!dx.empty()) place::copy_n<P>(dy.data(), dy.size(), dx.data());
        } else {
            std::get<K>(inner_).backward(params + offsets[K], grads + offsets[K], in, out_[K].view(), dy, dx, mode);
        }
    }

    // Sizes the inner buffers for a batch of n (allocating only beyond their capacity).
    void prepare(std::int64_t n) {
        if (n == batch_) return;
        batch_ = n;
        [&]<std::size_t... K>(std::index_sequence<K...>) {
            (out_[K].resize(inner_t<K>::output_shape::batched(n)), ...);
            // (The projection's output gradient is the block's: it has no buffer of its own.)
            ((K >= first_branch ? dout_[K].resize(inner_t<K>::output_shape::batched(n)) : void()), ...);
        }(std::make_index_sequence<num_inner>{});
        if constexpr (first_branch > 0) dx_branch_.resize(In::batched(n));
        forward_of_ = nullptr;
    }

    static void touch(Tensor<T, P>& t) {
        if constexpr (place::host_accessible_v<P>)
            if (t.data() && t.size() > 0) std::memset(static_cast<void*>(t.data()), 0, std::size_t(t.size()) * sizeof(T));
    }

    Inner inner_{};
    std::array<Tensor<T, P>, num_inner> out_{}, dout_{};  // each inner layer's output and its gradient
    Tensor<T, P> dx_branch_;                               // with a projection: the branch's input gradient
    std::int64_t batch_ = -1;
    const T* forward_of_ = nullptr;  // the input of the last forward (backward reuses its inner outputs)
    std::int64_t forward_batch_ = -1;
    std::uint64_t stream_ = 0;
};

}  // namespace detail

}  // namespace strata::nn
