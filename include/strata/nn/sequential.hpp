#pragma once
/// \file strata/nn/sequential.hpp
/// `Sequential<Input<...>, Layers...>`: a stack of layers whose shapes are worked out at compile
/// time, and `Network<Seq, T, Place>`: one replica's compute for it (bound layers, activation
/// and gradient buffers), whose forward and backward passes are each one inlined call chain over
/// the layer list — no virtual dispatch, no allocation once the buffers have grown to the batch.
/// The passes are defined out of the class, so that a program can compile them once for all its
/// units (`extern template`; docs/building.md, "Compile a network once").

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/core/function_ref.hpp"
#include "strata/core/half.hpp"
#include "strata/nn/layer.hpp"

namespace strata::nn {

namespace detail {
template <class In, class T, class P, class... Specs>
struct BindChain {
    using type = std::tuple<>;
    using output_shape = In;
};
template <class In, class T, class P, class S, class... Rest>
struct BindChain<In, T, P, S, Rest...> {
    using first = typename CheckedLayer<S, In, T, P>::type;  // the Layer concept, checked member by member
    using next = BindChain<typename first::output_shape, T, P, Rest...>;
    using type = decltype(std::tuple_cat(std::declval<std::tuple<first>>(), std::declval<typename next::type>()));
    using output_shape = typename next::output_shape;
};

template <class L>
constexpr bool aliases_input() {
    if constexpr (requires { L::aliases_input; }) return L::aliases_input;
    else return false;
}

template <class Tuple, std::size_t... I>
constexpr auto param_offsets(std::index_sequence<I...>) {
    std::array<std::int64_t, sizeof...(I) + 1> off{};
    const std::int64_t sizes[] = {std::tuple_element_t<I, Tuple>::num_params..., 0};
    for (std::size_t i = 0; i < sizeof...(I); ++i) off[i + 1] = off[i] + sizes[i];
    return off;
}

/// "(None, 28, 28, 1)": a batch of `dims` as Keras prints it (None for an unknown batch).
STRATA_DECL std::string shape_text(std::int64_t batch_dim, std::span<const std::int64_t> dims);
/// Keras's names for layers of these kinds, in order: "conv2d", "max_pooling2d", "conv2d_1", ...
STRATA_DECL std::vector<std::string> keras_layer_names(std::span<const char* const> kinds);
/// Appends a layer's parameters (its param_info()) to a network's list: each named
/// "<layer>/<name>", its offset moved by the layer's `offset` in the flat buffer.
STRATA_DECL void append_layer_params(std::vector<ParamInfo>& all, const std::string& layer, std::int64_t offset,
                                     std::vector<ParamInfo> params);
/// Sequential::summary()'s table from the layers' kinds, type names, output shapes (as
/// shape_text prints them) and parameter offsets (one more than layers); `non_trainable` of the
/// variables are not trained (batch normalization's moving statistics).
STRATA_DECL std::string summary_table(std::span<const char* const> kinds, std::span<const char* const> types,
                                      std::span<const std::string> shapes, std::span<const std::int64_t> offsets,
                                      std::int64_t non_trainable = 0);
/// The ranges of the flat buffer that are not trained, from a network's variables (ParamInfo
/// with trainable == false): adjacent ones with the same momentum merged, in buffer order.
struct MovingAverageSpan {
    std::int64_t first = 0, count = 0;
    double momentum = 0;
};
STRATA_DECL std::vector<MovingAverageSpan> moving_average_spans(const std::vector<ParamInfo>& params);
/// shape_text() of a StaticShape: the text is built out of line, once for every shape.
template <class S>
std::string shape_text(std::int64_t batch_dim = -1) {
    return shape_text(batch_dim, std::span<const std::int64_t>(S::dims));
}

/// The ranges of the flat buffer a mixed precision policy rounds before the layers read them:
/// the trained variables not marked float32 (ParamInfo::float32), merged where adjacent.
STRATA_DECL std::vector<std::pair<std::int64_t, std::int64_t>> compute_rounded_spans(const std::vector<ParamInfo>& params);

/// Rounds v[i] to the compute type `c` (BFloat16 or Float16), in place: what a mixed policy
/// hands between layers. The value goes through float (a double network is never mixed).
template <class T>
struct RoundToCompute {
    T* v;
    precision::Compute c;
    STRATA_HD void operator()(std::int64_t i) const {
        const float x = float(v[i]);
        v[i] = T(c == precision::Compute::BFloat16 ? round_to<bfloat16>(x) : round_to<float16>(x));
    }
};
template <class T, class P>
void round_to_compute(const TensorView<T, P>& v, precision::Compute c) {
    if (v.empty() || !precision::is_mixed(c)) return;
    const RoundToCompute<T> f{v.data(), c};
    if constexpr (place::host_accessible_v<P>) {
        // A few integer operations an element (under 1 ns): below 32 Ki elements a parallel
        // region costs more than it saves (a bias, a small layer's weights, a batch's logits).
        if (v.size() < (std::int64_t(1) << 15)) {
            for (std::int64_t i = 0; i < v.size(); ++i) f(i);
            return;
        }
    }
    place::for_each_n<P>(v.size(), f);
}
}  // namespace detail

template <class Seq, class T, class P>
class Network;

/// Whether bound layer L combines statistics over replicas (`static constexpr bool
/// synchronizes_replicas = true`: synchronized batch normalization, or a block holding one).
template <class L>
constexpr bool synchronizes_replicas_v = [] {
    if constexpr (requires { L::synchronizes_replicas; }) return bool(L::synchronizes_replicas);
    else return false;
}();

/// A Keras-style Sequential model: an `Input<...>` shape, then layer specs.
///
/// \code
/// using namespace strata::nn;
/// using Mnist = Sequential<Input<28, 28, 1>,
///                          Conv2D<32, 3, ReLU>, MaxPooling2D<2>,
///                          Conv2D<64, 3, ReLU>, MaxPooling2D<2>,
///                          Flatten, Dense<64, ReLU>, Dense<10, Softmax>>;
/// static_assert(Mnist::num_params == 121930);
/// \endcode
///
/// A layer that cannot take its input's shape is a compile error naming the layer and both
/// shapes.
template <class InputSpec, class... Specs>
struct Sequential {
    static_assert(sizeof...(Specs) >= 1, "strata::nn::Sequential: give at least one layer after the Input<...>");
    using input_shape = typename InputSpec::shape;
    template <class T, class P>
    using bound_layers = typename detail::BindChain<input_shape, T, P, Specs...>::type;
    using output_shape = typename detail::BindChain<input_shape, float, place::Host, Specs...>::output_shape;
    static constexpr std::size_t num_layers = sizeof...(Specs);
    static constexpr auto offsets =
        detail::param_offsets<bound_layers<float, place::Host>>(std::make_index_sequence<sizeof...(Specs)>{});
    /// Number of variables in the flat buffer (Keras's "Total params"): the trainable parameters
    /// and those that are not (batch normalization's moving statistics).
    static constexpr std::int64_t num_params = offsets[sizeof...(Specs)];
    /// Whether a layer combines statistics over replicas (synchronized batch normalization): a
    /// strategy whose replicas do not step together cannot run it.
    static constexpr bool synchronizes_replicas =
        []<std::size_t... I>(std::index_sequence<I...>) {
            return (synchronizes_replicas_v<std::tuple_element_t<I, bound_layers<float, place::Host>>> || ...);
        }(std::make_index_sequence<sizeof...(Specs)>{});

    /// Variables that are not trained (ParamInfo::trainable false): Keras's "Non-trainable params".
    static std::int64_t num_non_trainable() {
        std::int64_t n = 0;
        for (const auto& s : detail::moving_average_spans(parameters())) n += s.count;
        return n;
    }
    /// The ranges of the flat buffer the optimizer moves as averages rather than trains.
    static std::vector<detail::MovingAverageSpan> moving_averages() { return detail::moving_average_spans(parameters()); }

    /// Keras-style layer names: dense, dense_1, conv2d, ...
    static std::vector<std::string> layer_names() {
        static constexpr const char* kinds[] = {spec_keras_name<Specs>()...};
        return detail::keras_layer_names(kinds);
    }

    /// The Keras-like summary table: layer (type), output shape, parameter count.
    static std::string summary() {
        using Layers = bound_layers<float, place::Host>;
        static constexpr const char* kinds[] = {spec_keras_name<Specs>()...};
        static constexpr const char* types[] = {spec_name<Specs>()...};
        const std::vector<std::string> shapes = output_shapes<Layers>(std::make_index_sequence<num_layers>{});
        return detail::summary_table(kinds, types, shapes, offsets, num_non_trainable());
    }

    /// Name and shape of every parameter, in flat-buffer order: "conv2d/kernel", "dense_1/bias", ...
    static std::vector<ParamInfo> parameters() {
        using Layers = bound_layers<float, place::Host>;
        std::vector<ParamInfo> all;
        collect<Layers>(all, std::make_index_sequence<num_layers>{});
        return all;
    }

private:
    template <class Layers, std::size_t... I>
    static std::vector<std::string> output_shapes(std::index_sequence<I...>) {
        return {detail::shape_text<typename std::tuple_element_t<I, Layers>::output_shape>()...};
    }
    template <class Layers, std::size_t... I>
    static void collect(std::vector<ParamInfo>& all, std::index_sequence<I...>) {
        const auto names = layer_names();
        (detail::append_layer_params(all, names[I], offsets[I], std::tuple_element_t<I, Layers>::param_info()), ...);
    }
};

/// One replica's compute for a Sequential: bound layers plus the activation and gradient
/// buffers for the current batch size. Parameters and gradients live outside (flat buffers of
/// `num_params` elements, layer after layer, as `Seq::parameters()` lists them).
///
/// `Network(first, last)` runs only layers [first, last) of the Sequential: a pipeline stage's
/// share of the model (distribute/path/pipeline.hpp). Its input is layer `first`'s, its output
/// layer `last - 1`'s, and the `params` and `grads` it is given hold those layers' block alone
/// (the model's flat layout from `offsets[first]` to `offsets[last]`); the other layers'
/// buffers are never allocated. The layers keep their indices in the model (their random
/// streams, their names in the step profile), so a stage computes what the whole model's
/// network computes for its layers, bit for bit, and one compiled network serves every split.
namespace detail {
/// Fails, naming the layer (its bound type and index in the model are the template arguments),
/// when a model whose Embedding masks padding (mask_zero) has a layer that cannot carry the
/// token mask before a GlobalAveragePooling1D consumes it (nn::TokenMask, strata/nn/layer.hpp).
template <class Layer, std::size_t Index, bool Ok>
struct TokenMaskLayerError {
    static_assert(Ok, "strata::nn::Embedding<V, D, {.mask_zero = true}>: a layer between the Embedding and the "
                      "GlobalAveragePooling1D that consumes the token mask does not carry it (nn::TokenMask); the layer and "
                      "its index in the model are the template arguments of TokenMaskLayerError<Layer, Index> (Keras raises "
                      "the same for a layer without supports_masking)");
    static constexpr bool value = Ok;
};
/// Fails when the token mask reaches the model's output (nothing consumes it) and the output is
/// not one row per token of the mask: the loss could not leave the padding out.
template <class Model, bool Ok>
struct TokenMaskUnconsumedError {
    static_assert(Ok, "strata::nn::Embedding<V, D, {.mask_zero = true}>: the token mask reaches the model's output (no "
                      "GlobalAveragePooling1D consumes it), and the output is not [tokens, classes] with the mask's tokens, "
                      "so the loss cannot leave the padding out (the model is the template argument of "
                      "TokenMaskUnconsumedError)");
    static constexpr bool value = Ok;
};
/// Fails when a layer other than the first makes a token mask (the mask comes from the model's
/// input ids).
template <class Layer, std::size_t Index, bool Ok>
struct TokenMaskNotFirstError {
    static_assert(Ok, "strata::nn::Embedding<V, D, {.mask_zero = true}>: the masking Embedding must be the model's first "
                      "layer (its mask is made from the model's input ids); the layer and its index are the template "
                      "arguments of TokenMaskNotFirstError<Layer, Index>");
    static constexpr bool value = Ok;
};
/// out [n, S + 1] = the mask [n, S] with a 1 in front of each example's (the class token counts);
/// one value per index, on any place.
template <class T>
struct CountedFirst {
    const T* mask;
    T* out;
    std::int64_t S;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t t = i % (S + 1), e = i / (S + 1);
        out[i] = t == 0 ? T(1) : mask[e * S + t - 1];
    }
};
/// The first layer after layer 0 of the bound layers whose TokenMask is `use` and whose index is
/// below `before`; the number of layers when none.
template <class Layers, TokenMask use>
constexpr std::size_t first_mask_layer(std::size_t before = std::tuple_size_v<Layers>) {
    constexpr std::size_t L = std::tuple_size_v<Layers>;
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
        std::size_t c = L;
        ((c == L && I > 0 && I < before && token_mask_use<std::tuple_element_t<I, Layers>>() == use ? (c = I, 0) : 0), ...);
        return c;
    }(std::make_index_sequence<L>{});
}
/// The layer that consumes the token mask (GlobalAveragePooling1D, FirstToken), and the one before
/// it that prepends a counted token (ClassToken); the number of layers when none.
template <class Layers>
constexpr std::size_t mask_consumer_of() {
    return first_mask_layer<Layers, TokenMask::Consumes>();
}
template <class Layers>
constexpr std::size_t mask_prepend_of() {
    return first_mask_layer<Layers, TokenMask::Prepends>(mask_consumer_of<Layers>());
}
/// The checks above over a Network's bound layers: true when the first layer makes no mask, or
/// every layer after it carries the mask up to one that consumes it.
template <class Seq, class Layers>
constexpr bool check_token_mask() {
    constexpr std::size_t L = std::tuple_size_v<Layers>;
    if constexpr (!makes_token_mask<std::tuple_element_t<0, Layers>>()) {
        return [&]<std::size_t... I>(std::index_sequence<I...>) {
            return (TokenMaskNotFirstError<std::tuple_element_t<I, Layers>, I,
                                           I == 0 || !makes_token_mask<std::tuple_element_t<I, Layers>>()>::value &&
                    ...);
        }(std::make_index_sequence<L>{});
    } else {
        constexpr std::size_t consumer = mask_consumer_of<Layers>(), prepend = mask_prepend_of<Layers>();
        using Out = typename Seq::output_shape;
        constexpr bool per_token_output = Out::rank == 2 && Out::dims[0] == std::tuple_element_t<0, Layers>::S;
        return TokenMaskUnconsumedError<Seq, (consumer < L || per_token_output)>::value &&
               []<std::size_t... I>(std::index_sequence<I...>) {
                   return (TokenMaskLayerError<std::tuple_element_t<I, Layers>, I,
                                               I == 0 || I >= consumer || I == prepend ||
                                                   token_mask_use<std::tuple_element_t<I, Layers>>() == TokenMask::Passes>::value &&
                           ...);
               }(std::make_index_sequence<L>{}) &&
               []<std::size_t... I>(std::index_sequence<I...>) {
                   return (TokenMaskNotFirstError<std::tuple_element_t<I, Layers>, I,
                                                  I == 0 || !makes_token_mask<std::tuple_element_t<I, Layers>>()>::value &&
                           ...);
               }(std::make_index_sequence<L>{});
    }
}
}  // namespace detail

template <class Seq, class T, class P>
class Network {
public:
    using Layers = typename Seq::template bound_layers<T, P>;
    static constexpr std::size_t L = Seq::num_layers;
    static constexpr auto offsets = Seq::offsets;
    static constexpr std::int64_t num_params = Seq::num_params;
    using input_shape = typename Seq::input_shape;
    using output_shape = typename Seq::output_shape;
    /// The first layer masks padding (Embedding with mask_zero): the network makes the token
    /// mask from its input and hands it to every layer (Mode::token_mask).
    static constexpr bool masks_tokens = detail::makes_token_mask<std::tuple_element_t<0, Layers>>();
    static_assert(detail::check_token_mask<Seq, Layers>(), "strata::nn::Network: the token mask cannot be carried (above)");
    /// The token mask reaches the output (one row per token, no pooling): the loss and the
    /// accuracy leave the padded tokens out (Model passes them the mask as token weights).
    static constexpr bool masks_output = masks_tokens && detail::mask_consumer_of<Layers>() == L;
    /// The layer that prepends a counted token to the masked ones (ClassToken) before the mask's
    /// consumer; L when none. The layers after it get the mask with a 1 in front.
    static constexpr std::size_t mask_prepend_at = masks_tokens ? detail::mask_prepend_of<Layers>() : L;
    /// The last forward's token mask, [n, tokens] values of T on P (1: counts, 0: padding); null
    /// without masks_tokens or before a forward.
    const T* token_mask() const {
        if constexpr (masks_tokens) return token_mask_.empty() ? nullptr : token_mask_.data();
        else return nullptr;
    }
    /// Whether this part of the network reads the token mask but does not make it: it starts
    /// after the masking Embedding, at or before the layer that consumes the mask (a pipeline
    /// stage between them). It is then given the model's input ids before each forward.
    bool needs_token_ids() const {
        if constexpr (masks_tokens) return first_ > 0 && first_ <= mask_consumer();
        else return false;
    }
    /// For a part that needs_token_ids: the model's input ids of the batch the next forward
    /// takes ([n, tokens], on P), from which it makes the token mask the Embedding would have.
    /// Without it such a forward is a ValueError (its layers would treat padding as tokens).
    void set_token_ids(const TensorView<T, P>& ids) {
        if constexpr (masks_tokens) {
            if (!needs_token_ids()) return;
            make_mask(ids);
            ids_given_ = ids.dim(0);
        } else {
            (void)ids;
        }
    }

    Network() : Network(0, L) {}
    /// Layers [first, last) only (see the class comment); ValueError unless first < last <= L.
    Network(std::size_t first, std::size_t last) : first_(first), last_(last) {
        STRATA_CHECK(first < last && last <= L, ValueError, "Network: layers [", first, ", ", last, ") of a Sequential of ", L,
                     " layers; a range holds at least one of them");
        base_ = offsets[first];
        set_streams(std::make_index_sequence<L>{});
        link_layers(std::make_index_sequence<L - 1>{});
        if constexpr (profile::enabled) label_layers(std::make_index_sequence<L>{});
    }

    /// The layers this network runs: [first_layer(), last_layer()).
    std::size_t first_layer() const { return first_; }
    std::size_t last_layer() const { return last_; }
    /// The shape of layer `l`'s input for a batch of `n` examples (l = 0: the model's input).
    static Shape layer_input_shape(std::size_t l, std::int64_t n) {
        const auto dims = input_dims(l);
        Shape s{n};
        for (auto d : dims) s.push_back(d);
        return s;
    }
    /// The shape of layer `l`'s output for a batch of `n` examples.
    static Shape layer_output_shape(std::size_t l, std::int64_t n) { return layer_input_shape(l + 1, n); }

    /// Initialises every layer's parameters in `params` (Keras's defaults), reproducibly.
    void init(T* params, std::uint64_t seed);

    /// Runs the layers on `x` ([n, input_shape...]) and returns the output view
    /// ([n, output_shape...]), valid until the next call.
    TensorView<T, P> forward(const T* params, const TensorView<T, P>& x, const Mode& mode);

    /// Allocates every buffer a batch of `n` examples needs (the activations; with `training`
    /// also their gradients and the layers' training workspaces) and touches it, so that the
    /// first pass over such a batch allocates nothing and takes no page faults. Fresh memory
    /// costs a page fault per 4 KiB page on first use, which some virtual machines make very
    /// slow (12 us per page measured on this project's VM: 33 ms for the seed CNN's first
    /// activation at batch 128). A layer with a `reserve(n, training)` member sizes its own
    /// workspaces. Call it on the thread that will run the network.
    /// Batches no larger than one already reserved for cost nothing more.
    void reserve(std::int64_t n, bool training);

    /// The gradient of the loss w.r.t. the output: the loss writes it here before `backward`.
    TensorView<T, P> output_grad() const { return dout_[last_ - 1]; }
    TensorView<T, P> output() const { return out_[last_ - 1]; }

    /// Called by backward after each layer with the range of `grads` that is final.
    using ReadyHook = FunctionRef<void(std::int64_t first, std::int64_t count)>;
    /// Back-propagates `output_grad()` through the layers, writing every parameter gradient into
    /// `grads`. After each layer, `on_ready(first, count)` (when given) is told which range of
    /// `grads` is final (ranges arrive from the end of the buffer to its start), so gradient
    /// all-reduce can start while earlier layers are still being differentiated. With a non-empty
    /// `input_grad` ([n, input shape...]) it also writes the gradient of the loss w.r.t. the input
    /// of the last forward there: what a pipeline stage hands back to the stage before it
    /// (distribute/pipeline.hpp); without one it skips that product.
    /// Requires a forward without `mode.no_backward` before it.
    void backward(const T* params, T* grads, const Mode& mode, ReadyHook on_ready = nullptr,
                  const TensorView<T, P>& input_grad = {});

    /// What a replica whose share of a training step is empty does (synchronized layers only):
    /// takes part in every sum over replicas the others make, in the order a forward and a
    /// backward pass would make them, contributing nothing, and tells `on_ready` about each
    /// layer's (zero) gradient as backward would, so that gradient buckets and those sums reach
    /// the replicas' communication in the same order everywhere. `grads` must be zero.
    void join_empty(const T* params, T* grads, const Mode& mode, ReadyHook on_ready = nullptr);

    Layers& layers() { return layers_; }

private:
    template <std::size_t I>
    using layer_input = std::conditional_t<I == 0, input_shape, typename std::tuple_element_t<(I == 0 ? 0 : I - 1), Layers>::output_shape>;
    // The extents of layer l's input (l = L: the model's output), without the batch.
    static std::span<const std::int64_t> input_dims(std::size_t l) {
        return [l]<std::size_t... I>(std::index_sequence<I...>) {
            std::span<const std::int64_t> out(output_shape::dims);
            ((l == I ? void(out = std::span<const std::int64_t>(layer_input<I>::dims)) : void()), ...);
            return out;
        }(std::make_index_sequence<L>{});
    }
    // Whether layer I is one this network runs.
    template <std::size_t I>
    bool runs() const {
        return I >= first_ && I < last_;
    }

    // Layers that draw random numbers (Dropout) get their own stream: layer index × 16, the
    // same stream init() passes, so every replica's copy of the layer draws alike.
    template <std::size_t... I>
    void set_streams(std::index_sequence<I...>) {
        auto one = [](auto& layer, std::uint64_t stream) {
            if constexpr (requires { layer.set_stream(stream); }) layer.set_stream(stream);
        };
        (one(std::get<I>(layers_), std::uint64_t(I) * 16), ...);
    }
    // Neighbouring layers this network runs both of (nn::link_neighbours).
    template <std::size_t... I>
    void link_layers(std::index_sequence<I...>) {
        ((runs<I>() && runs<I + 1>() ? link_neighbours(std::get<I>(layers_), std::get<I + 1>(layers_)) : void()), ...);
    }
    // The step profiler (core/profile.hpp) reports each layer under its summary() name.
    template <std::size_t... I>
    void label_layers(std::index_sequence<I...>) {
        const auto names = Seq::layer_names();
        (profile::label(&profile_keys_[I], names[I], int(I)), ...);
    }
    template <std::size_t... I>
    void init_impl(T* params, std::uint64_t seed, std::index_sequence<I...>) {
        (std::get<I>(layers_).init(params + offsets[I], seed, std::uint64_t(I) * 16), ...);
    }

    void prepare(const TensorView<T, P>& x) {
        input_ = x;
        prepare_shapes(x.dim(0));
    }
    void prepare_shapes(std::int64_t n) {
        if (n == batch_) return;
        batch_ = n;
        prepare_impl(n, std::make_index_sequence<L>{});
    }
    template <std::size_t... I>
    void reserve_impl(std::int64_t n, bool training, std::index_sequence<I...>) {
        (reserve_one<I>(n, training), ...);
    }
    template <std::size_t I>
    void reserve_one(std::int64_t n, bool training) {
        if (!runs<I>()) return;
        auto touch = [](Tensor<T, P>& t) {
            if constexpr (place::host_accessible_v<P>)
                if (t.data() && t.size() > 0) std::memset(static_cast<void*>(t.data()), 0, std::size_t(t.size()) * sizeof(T));
        };
        // A layer that runs the next one's forward on each chunk (fuses_next) stores its output
        // only when something will read it: not in inference, and not in training when its
        // backward takes the gradient from the next layer too (fuses_backward_next), which then
        // never stores this layer's output gradient either. Those buffers stay allocated but
        // untouched (no pages), for a pass that does not fuse (a batch too small to share).
        const bool output_unread = training ? fuses_backward_next<I>() : fuses_next<I>();
        if (!output_unread) touch(act_[I]);
        if (training && !fuses_backward_next<I>()) touch(grad_[I]);
        auto& layer = std::get<I>(layers_);
        if constexpr (requires { layer.reserve(n, training); }) layer.reserve(n, training);
    }
    template <std::size_t... I>
    void prepare_impl(std::int64_t n, std::index_sequence<I...>) {
        (prepare_one<I>(n), ...);
    }
    template <std::size_t I>
    void prepare_one(std::int64_t n) {
        if (!runs<I>()) return;
        using Layer = std::tuple_element_t<I, Layers>;
        const Shape s = Layer::output_shape::batched(n);
        if constexpr (detail::aliases_input<Layer>() && I > 0) {
            if (I > first_) {
                out_[I] = out_[I - 1].reshape(s);
                dout_[I] = dout_[I - 1].reshape(s);
                return;
            }
        }
        act_[I].resize(s);
        grad_[I].resize(s);
        out_[I] = act_[I].view();
        dout_[I] = grad_[I].view();
    }

    template <std::size_t... I>
    void forward_impl(const T* params, const Mode& mode, std::index_sequence<I...>) {
        if (precision::is_mixed(mode.compute)) ((forward_one<I>(params, mode), round_output<I>()), ...);
        else (forward_one<I>(params, mode), ...);
    }
    // Whether layer I runs layer I+1's forward on each chunk of its output (Conv2D then
    // MaxPooling2D on the host: the pooling reads the convolution's output from cache), when
    // this network runs both.
    template <std::size_t I>
    static constexpr bool fuses_next() {
        if constexpr (I + 1 < L) {
            using Layer = std::tuple_element_t<I, Layers>;
            using Next = std::tuple_element_t<I + 1, Layers>;
            if constexpr (requires { Layer::template fuses<Next>; }) return Layer::template fuses<Next>;
            else return false;
        } else {
            return false;
        }
    }

    // Whether layer I's backward takes its output gradient from layer I+1 chunk by chunk, after
    // a fused forward (Conv2D then MaxPooling2D on the host; see Conv2D::backward_then).
    template <std::size_t I>
    static constexpr bool fuses_backward_next() {
        if constexpr (fuses_next<I>()) {
            using Layer = std::tuple_element_t<I, Layers>;
            using Next = std::tuple_element_t<I + 1, Layers>;
            if constexpr (requires { Layer::template fuses_backward<Next>; }) return Layer::template fuses_backward<Next>;
            else return false;
        } else {
            return false;
        }
    }

    template <std::size_t I>
    STRATA_INLINE void forward_one(const T* params, const Mode& mode) {
        using Layer = std::tuple_element_t<I, Layers>;
        if (!runs<I>()) return;
        if constexpr (I > 0 && fuses_next<(I > 0 ? I - 1 : 0)>()) {
            if (I > first_ && ran_next_[I - 1]) return;  // the layer before ran this one's forward
        }
        const TensorView<T, P> in = I == first_ ? input_ : out_[I == 0 ? 0 : I - 1];
        if constexpr (detail::aliases_input<Layer>()) {
            if (I == first_) out_[I] = input_.reshape(Layer::output_shape::batched(input_.dim(0)));
        }
        Mode m = mode;
        m.skip_activation = mode.skip_activation && I == L - 1;
        mask_for<I>(m);
        const T* p = params + (offsets[I] - base_);
        STRATA_PROFILE_GROUP(&profile_keys_[I], "forward");
        if constexpr (fuses_next<I>()) {
            ran_next_[I] = false;
            if (I + 1 < last_) {
                Mode next = mode;
                next.skip_activation = mode.skip_activation && I + 1 == L - 1;
                mask_for<I + 1>(next);
                ran_next_[I] = !next.skip_activation &&
                               std::get<I>(layers_).forward_then(p, in, out_[I], std::get<I + 1>(layers_), out_[I + 1], m);
                if (ran_next_[I]) return;
            }
        }
        std::get<I>(layers_).forward(p, in, out_[I], m);
    }

    // Under a mixed policy: layer I's output, as the compute type hands it to the next layer.
    // The model's output (the last layer's) stays float32 (the loss reads it: Keras' advice of a
    // float32 last layer). A layer that views its input another way (Flatten) is not rounded
    // again; a layer that ran the next one's forward (fused) has that one's output rounded.
    template <std::size_t I>
    void round_output() {
        using Layer = std::tuple_element_t<I, Layers>;
        if (!runs<I>()) return;
        if constexpr (I > 0 && fuses_next<(I > 0 ? I - 1 : 0)>()) {
            if (I > first_ && ran_next_[I - 1]) return;  // rounded with the layer before
        }
        std::size_t o = I;
        if constexpr (fuses_next<I>()) {
            if (ran_next_[I]) o = I + 1;
        }
        if (o == L - 1) return;
        if constexpr (detail::aliases_input<Layer>()) {
            if (o == I) return;
        }
        detail::round_to_compute(out_[o], compute_);
    }

    // The weights the layers read under a mixed policy: the variables of this network's layers
    // copied and the trained, non-float32 ones rounded (compute_rounded_spans).
    const T* rounded_params(const T* params) {
        const std::int64_t count = offsets[last_] - base_;
        if (count == 0) return params;
        compute_params_.resize(Shape{count});
        copy(TensorView<T, P>(const_cast<T*>(params), Shape{count}), compute_params_.view());
        static const auto spans = detail::compute_rounded_spans(Seq::parameters());
        for (const auto& [first, n] : spans) {
            const std::int64_t lo = std::max(first, base_), hi = std::min(first + n, offsets[last_]);
            if (lo < hi) detail::round_to_compute(TensorView<T, P>(compute_params_.data() + (lo - base_), Shape{hi - lo}), compute_);
        }
        return compute_params_.data();
    }

    template <std::size_t K>
    STRATA_INLINE void backward_impl(const T* params, T* grads, const Mode& mode, ReadyHook on_ready) {
        if constexpr (K > 0) {
            constexpr std::size_t I = K - 1;
            if (I < first_) return;
            if (runs<I>()) {
                const TensorView<T, P> in = I == first_ ? input_ : out_[I == 0 ? 0 : I - 1];
                const TensorView<T, P> dx = I == first_ ? input_grad_ : dout_[I == 0 ? 0 : I - 1];
                Mode m = mode;
                m.skip_activation = mode.skip_activation && I == L - 1;
                mask_for<I>(m);
                const std::int64_t at = offsets[I] - base_;
                bool done = false;
                if constexpr (I > 0 && fuses_backward_next<(I > 0 ? I - 1 : 0)>()) {
                    done = I > first_ && ran_next_[I - 1] && trained_;  // the layer before takes this one's backward into its own
                }
                if constexpr (fuses_backward_next<I>()) {
                    if (ran_next_[I] && trained_) {  // (a training forward: the pooling recorded its maxima)
                        STRATA_PROFILE_GROUP(&profile_keys_[I], "backward");
                        std::get<I>(layers_).backward_then(params + at, grads + at, in, dx, std::get<I + 1>(layers_), out_[I + 1],
                                                           dout_[I + 1]);
                        done = true;
                    }
                }
                if (!done) {
                    STRATA_PROFILE_GROUP(&profile_keys_[I], "backward");
                    std::get<I>(layers_).backward(params + at, grads + at, in, out_[I], dout_[I], dx, m);
                }
                if constexpr (detail::aliases_input<std::tuple_element_t<I, Layers>>()) {
                    // A first layer that only views its input another way (Flatten) leaves its
                    // output gradient where its input gradient is wanted.
                    if (I == first_ && !input_grad_.empty()) copy(dout_[I], input_grad_);
                } else if (precision::is_mixed(mode.compute)) {
                    detail::round_to_compute(dx, mode.compute);  // the gradient the layer before reads
                }
                if constexpr (offsets[I + 1] > offsets[I])
                    if (on_ready) on_ready(at, offsets[I + 1] - offsets[I]);
            }
            backward_impl<I>(params, grads, mode, on_ready);
        }
    }

    template <std::size_t K>
    void join_backward(T* grads, const Mode& mode, ReadyHook on_ready) {
        if constexpr (K > 0) {
            constexpr std::size_t I = K - 1;
            if (I < first_) return;
            if (runs<I>()) {
                const std::int64_t at = offsets[I] - base_;
                auto& layer = std::get<I>(layers_);
                if constexpr (requires { layer.join_backward(grads, mode); }) layer.join_backward(grads + at, mode);
                if constexpr (offsets[I + 1] > offsets[I])
                    if (on_ready) on_ready(at, offsets[I + 1] - offsets[I]);
            }
            join_backward<I>(grads, mode, on_ready);
        }
    }

    Layers layers_{};
    std::array<Tensor<T, P>, L> act_{}, grad_{};
    std::array<TensorView<T, P>, L> out_{}, dout_{};
    TensorView<T, P> input_{};
    TensorView<T, P> input_grad_{};       // where backward writes the input's gradient; empty: nowhere
    precision::Compute compute_ = precision::Compute::Float32;  // the last forward's compute type
    Tensor<T, P> compute_params_{};       // mixed policies: the weights as the layers read them
    Tensor<T, P> input_copy_{};           // mixed policies: the model's input, rounded
    std::int64_t batch_ = -1;
    std::array<char, L> profile_keys_{};  // one address per layer for the step profiler
    std::int64_t reserved_[2] = {0, 0};   // the largest batch reserved for inference, for training
    std::array<bool, L> ran_next_{};      // layer I ran layer I+1's forward in this pass
    bool trained_ = false;                // the last forward was in training mode
    std::size_t first_ = 0, last_ = L;    // the layers this network runs: [first_, last_)
    std::int64_t base_ = 0;               // offsets[first_]: where the given params and grads start
    Tensor<T, P> token_mask_{};           // masks_tokens: the last forward's token mask [n, tokens]
    Tensor<T, P> token_mask_after_{};     // with a ClassToken: [n, 1 + tokens], the class token first
    std::int64_t ids_given_ = -1;         // needs_token_ids: the examples of the ids set_token_ids gave (-1: none)

    // The index of the layer that consumes the token mask (L without a mask).
    static constexpr std::size_t mask_consumer() { return masks_tokens ? detail::mask_consumer_of<Layers>() : L; }
    // Layer I's token mask: after the layer that prepends a counted token, the mask with a 1 in
    // front (m already holds the input's, from with_token_mask).
    template <std::size_t I>
    void mask_for(Mode& m) const {
        if constexpr (masks_tokens && mask_prepend_at < L && I > mask_prepend_at) {
            if (m.token_mask) {
                m.token_mask = token_mask_after_.data();
                m.mask_tokens = std::tuple_element_t<0, Layers>::S + 1;
            }
        }
    }
    // The token mask (and with a ClassToken, the mask with a 1 in front) of input ids [n, S].
    void make_mask(const TensorView<T, P>& ids) {
        if constexpr (masks_tokens) {
            token_mask_.resize(Shape{ids.size() > 0 ? ids.size() : 1});
            std::tuple_element_t<0, Layers>::make_token_mask(ids, token_mask_.data());
            if constexpr (mask_prepend_at < L) {
                constexpr std::int64_t S = std::tuple_element_t<0, Layers>::S;
                const std::int64_t n = ids.dim(0);
                token_mask_after_.resize(Shape{n > 0 ? n * (S + 1) : 1});
                if (n > 0) place::for_each_n<P>(n * (S + 1), detail::CountedFirst<T>{token_mask_.data(), token_mask_after_.data(), S});
            }
        } else {
            (void)ids;
        }
    }
    // The pass's Mode with the token mask of the last forward's input (masks_tokens), when this
    // network runs layers that read it.
    Mode with_token_mask(const Mode& mode) const {
        Mode m = mode;
        if constexpr (masks_tokens) {
            if ((first_ == 0 || needs_token_ids()) && !token_mask_.empty()) {
                m.token_mask = token_mask_.data();
                m.mask_tokens = std::tuple_element_t<0, Layers>::S;
            }
        }
        return m;
    }
};

// The passes are defined out of the class, so that they are not inline: a program whose units
// share a network compiles its layers' kernels once, in the unit that instantiates it
// (`template class strata::nn::Network<Net, float, strata::place::Host>;`), the others declaring
// it `extern template` (docs/building.md, "Compile a network once").
template <class Seq, class T, class P>
void Network<Seq, T, P>::init(T* params, std::uint64_t seed) {
    init_impl(params, seed, std::make_index_sequence<L>{});
}

template <class Seq, class T, class P>
TensorView<T, P> Network<Seq, T, P>::forward(const T* params, const TensorView<T, P>& x, const Mode& mode) {
    if (first_ == 0) {
        STRATA_CHECK(x.shape() == input_shape::batched(x.dim(0)), ShapeError, "Sequential: the input batch has shape ",
                     x.shape(), ", the model takes ", detail::shape_text<input_shape>());
    } else {
        STRATA_CHECK(x.rank() >= 1 && x.shape() == layer_input_shape(first_, x.dim(0)), ShapeError, "Sequential: the input batch of layer ",
                     first_, " has shape ", x.shape(), ", the layer takes ", detail::shape_text(-1, input_dims(first_)));
    }
    compute_ = mode.compute;
    if (precision::is_mixed(compute_)) {
        // A mixed policy: the layers read the weights, and the model its input, as values of the
        // compute type (Keras' autocast), from copies; the variables stay as they are.
        params = rounded_params(params);
        // Token ids (a first layer with integer_input: Embedding) stay exact: bfloat16 keeps
        // integers only up to 256, float16 up to 2048.
        if (first_ == 0 && !takes_integer_input<std::tuple_element_t<0, Layers>>()) {
            input_copy_.resize(x.shape());
            copy(x, input_copy_.view());
            detail::round_to_compute(input_copy_.view(), compute_);
            prepare(input_copy_.view());
        } else {
            prepare(x);
        }
    } else {
        prepare(x);
    }
    trained_ = mode.training;
    if constexpr (masks_tokens) {
        if (first_ == 0) {
            make_mask(x);
        } else if (needs_token_ids()) {
            STRATA_CHECK(ids_given_ == x.dim(0), ValueError, "Sequential: layers [", first_, ", ", last_,
                         ") of a model whose Embedding masks padding (mask_zero) read the token mask but do not make it: "
                         "give them the batch's input ids (set_token_ids) before each forward; ",
                         ids_given_ < 0 ? std::string("none were given") : "ids of " + std::to_string(ids_given_) + " examples were given",
                         " for a batch of ", x.dim(0));
            ids_given_ = -1;  // one forward each
        }
    }
    const strata::detail::Tf32Scope<P> tf32(mode.compute == precision::Compute::TF32);
    forward_impl(params, with_token_mask(mode), std::make_index_sequence<L>{});
    return out_[last_ - 1];
}

template <class Seq, class T, class P>
void Network<Seq, T, P>::reserve(std::int64_t n, bool training) {
    std::int64_t& done = reserved_[training ? 1 : 0];
    if (n <= done) return;
    prepare_shapes(n);
    reserve_impl(n, training, std::make_index_sequence<L>{});
    if constexpr (masks_tokens) {  // the token mask's storage too: the first step allocates nothing
        const bool makes = first_ == 0 || needs_token_ids();
        if (makes && n > 0 && token_mask_.size() < n * std::tuple_element_t<0, Layers>::S)
            token_mask_.resize(Shape{n * std::tuple_element_t<0, Layers>::S});
        if constexpr (mask_prepend_at < L) {
            if (makes && n > 0 && token_mask_after_.size() < n * (std::tuple_element_t<0, Layers>::S + 1))
                token_mask_after_.resize(Shape{n * (std::tuple_element_t<0, Layers>::S + 1)});
        }
    }
    done = n;
}

template <class Seq, class T, class P>
void Network<Seq, T, P>::join_empty(const T* params, T* grads, const Mode& mode, ReadyHook on_ready) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        auto one = [&](auto& layer, std::size_t i, std::int64_t at) {
            if (i < first_ || i >= last_) return;
            if constexpr (requires { layer.join_forward(params, mode); }) layer.join_forward(params + at, mode);
        };
        (one(std::get<I>(layers_), I, offsets[I] - base_), ...);
    }(std::make_index_sequence<L>{});
    join_backward<L>(grads, mode, on_ready);
}

template <class Seq, class T, class P>
void Network<Seq, T, P>::backward(const T* params, T* grads, const Mode& mode, ReadyHook on_ready,
                                  const TensorView<T, P>& input_grad) {
    input_grad_ = input_grad;
    struct Clear {  // the input gradient is written by this pass only
        TensorView<T, P>& v;
        ~Clear() { v = {}; }
    } clear{input_grad_};
    // Under a mixed policy the layers read the rounded weights the forward read.
    if (precision::is_mixed(mode.compute)) {
        STRATA_CHECK(compute_ == mode.compute && !compute_params_.empty(), ValueError,
                     "Sequential: backward under precision ", precision::name_of(mode.compute), " follows a forward under ",
                     precision::name_of(compute_));
        params = compute_params_.data();
    }
    const strata::detail::Tf32Scope<P> tf32(mode.compute == precision::Compute::TF32);
    backward_impl<L>(params, grads, with_token_mask(mode), on_ready);
}

}  // namespace strata::nn

#if STRATA_DEFINITIONS
#include "strata/nn/impl/sequential.ipp"
#endif
