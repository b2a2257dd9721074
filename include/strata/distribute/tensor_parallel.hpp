#pragma once
/// \file strata/distribute/tensor_parallel.hpp
/// Tensor (intra-layer) model parallelism: `TensorParallelDense<Units, Act, Shards, Axis>` is a
/// Dense layer whose kernel is split into `Shards` pieces, each multiplied on its own thread
/// (on its own logical device when at least `Shards` are configured), as Megatron-LM splits its
/// transformer's Dense layers (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion
/// Parameter Language Models Using Model Parallelism", §3):
///
/// | Axis      | shard j holds                 | forward                                        | backward (input gradient)          |
/// |-----------|-------------------------------|------------------------------------------------|------------------------------------|
/// | `Columns` | kernel columns (output units) | Y_j = X · W_j, then **all-gather** Y = [Y_0 … ]| **reduce**: dX = Σ_j dY_j · W_jᵀ    |
/// | `Rows`    | kernel rows (input features)  | Y_j = X_j · W_j, then **reduce** Y = Σ_j Y_j    | **all-gather**: dX = [dY · W_jᵀ … ] |
///
/// It is a drop-in for `Dense<Units, Act>` in a Sequential: the same parameters, in the same
/// flat layout and under the same names ("dense/kernel", "dense/bias"), initialised alike, so
/// its checkpoints are Dense's and training equals the unsplit layer up to the order of the
/// sums (tests/test_pipeline.cpp: float64 to 1e-12). Bias and activation are applied once to
/// the gathered (reduced) output. The variables themselves stay in the model's flat buffer
/// (each shard reads its part, copying the columns it needs): what is split is the compute
/// and the activations, each shard's on its device.
///
/// \code
/// using Net = Sequential<Input<784>, distribute::TensorParallelDense<4096, ReLU, 4>, Dense<10, Softmax>>;
/// \endcode

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/distribute/replica_pool.hpp"
#include "strata/distribute/shard_group.hpp"
#include "strata/nn/dense.hpp"
#include "strata/nn/token_dense.hpp"
#include "strata/place/devices.hpp"
#include "strata/place/threads.hpp"

namespace strata::distribute {

/// TensorParallelDense splits the kernel's output units (Megatron's column-parallel layer).
struct Columns {
    static constexpr const char* name = "columns";
};
/// TensorParallelDense splits the kernel's input features (Megatron's row-parallel layer).
struct Rows {
    static constexpr const char* name = "rows";
};

namespace detail {
template <std::int64_t Units, class Act, int Shards, class Axis, bool PerToken, class In, class T, class P>
class TensorParallelDenseImpl;

// Rows x columns [first, first + cols) of a row-major matrix with `stride` columns, to or from a
// contiguous [rows, cols] block. (At namespace scope: nvcc needs kernel functors it can name.)
template <class T>
struct GatherColumns {
    const T* src;
    T* dst;
    std::int64_t stride, first, cols;
    STRATA_HD void operator()(std::int64_t i) const { dst[i] = src[(i / cols) * stride + first + i % cols]; }
};
template <class T>
struct ScatterColumns {
    const T* src;
    T* dst;
    std::int64_t stride, first, cols;
    STRATA_HD void operator()(std::int64_t i) const { dst[(i / cols) * stride + first + i % cols] = src[i]; }
};
template <class P, class F>
void each_index(std::int64_t count, F f) {
    if (count > 0) place::for_each_n<P>(count, f);
}

/// A block of a row-major matrix in a flat buffer: `rows` rows of `cols` values from column
/// `first`, the matrix `stride` values wide and starting at `offset`. (The part of a split
/// variable or activation a shard computes: ShardPool::gather.)
struct SplitBlock {
    std::int64_t offset, rows, stride, first, cols;
};

/// Where a tensor-parallel layer's shards run: by default one thread per shard, each inside
/// logical device j when at least `shards` are configured for the place (and more than one
/// shard), otherwise on the host with its share of the cores. When the job has a
/// tensor-parallel group of processes (shard_group.hpp: distribute::tensor_parallel_processes()),
/// this process runs its own shard only, and the layer's sums over shards are sums over the
/// processes (across()). Decided on the first run.
template <class P>
class ShardPool {
public:
    ShardPool(int shards, const char* layer) : shards_(shards), layer_(layer) {}

    /// Runs f(j) on every shard's thread and waits for all (a shard's exception passes on);
    /// across processes, f(shard()) on the calling thread.
    template <class F>
    void run(F&& f) {
        if (!started_) start();
        if (group_) {
            STRATA_CHECK(claim_shard_group_thread(), ValueError, layer_, ": tensor parallelism across processes (",
                         group_->describe(), ") runs the split layers on one thread of each process, the one that ran the first (one "
                         "replica per process: OneDevice), but another thread ran this one (a second replica of Mirrored?)");
            f(group_->shard());
        } else {
            pool_->run(f);
        }
    }
    /// Whether the shards are the job's processes (known once the pool has run).
    bool across() const { return group_ != nullptr; }
    /// Across processes: this process's shard.
    int shard() const { return group_ ? group_->shard() : 0; }
    /// Across processes: sums count values at data over the processes, in place (`what` names
    /// the sum in a timeout's message: a string literal).
    template <class T>
    void sum(T* data, std::int64_t count, const char* what) {
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
            group_->sum(std::span<T>(data, std::size_t(count)), what);
        } else {
            throw ValueError(std::string(layer_) + ": tensor parallelism across processes sums float or double activations; this "
                                                   "model computes in another type");
        }
    }
    /// Across processes: all-gathers the shards' blocks of `base` in place. blocks(j, f) calls
    /// f(SplitBlock) for each block of shard j, in one fixed order; on entry this process holds
    /// its own shard's blocks, on return every shard's, bit for bit (what is outside them is not
    /// touched). The blocks are packed shard by shard into one buffer, all-gathered
    /// (ShardGroup::gather: each process receives the others' parts only), and unpacked.
    template <class T, class Blocks>
    void gather(T* base, Blocks blocks, const char* what) {
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
            const int me = group_->shard();
            counts_.assign(std::size_t(shards_), 0);
            for (int j = 0; j < shards_; ++j) blocks(j, [&](const SplitBlock& b) { counts_[std::size_t(j)] += b.rows * b.cols; });
            std::int64_t total = 0, mine = 0;
            for (int j = 0; j < shards_; ++j) {
                if (j == me) mine = total;
                total += counts_[std::size_t(j)];
            }
            std::vector<T>& packed = packed_buffer<T>();
            packed.resize(std::size_t(total));
            // Walks shard j's blocks row by row, with the packed position of each row.
            auto each_row = [&](int j, std::int64_t at, auto&& row) {
                blocks(j, [&](const SplitBlock& b) {
                    for (std::int64_t r = 0; r < b.rows; ++r, at += b.cols) row(b.offset + r * b.stride + b.first, at, b.cols);
                });
            };
            each_row(me, mine, [&](std::int64_t src, std::int64_t at, std::int64_t n) { std::copy_n(base + src, n, packed.data() + at); });
            group_->gather(std::span<T>(packed), std::span<const std::int64_t>(counts_), what);
            std::int64_t at = 0;
            for (int j = 0; j < shards_; ++j) {
                if (j != me)
                    each_row(j, at, [&](std::int64_t dst, std::int64_t from, std::int64_t n) { std::copy_n(packed.data() + from, n, base + dst); });
                at += counts_[std::size_t(j)];
            }
        } else {
            throw ValueError(std::string(layer_) + ": tensor parallelism across processes gathers float or double values; this "
                                                   "model computes in another type");
        }
    }
    /// The logical devices the shards run on (names), once the pool has run; across processes,
    /// this process's shard ("process 1 of 2").
    const std::vector<std::string>& devices() const { return devices_; }

private:
    void start() {
        if (ShardGroup* g = job_shard_group()) {
            STRATA_CHECK((std::is_same_v<P, place::Host>), ValueError, layer_,
                         ": tensor parallelism across processes runs on the host; this layer is on a GPU");
            STRATA_CHECK(g->shards() == shards_, ValueError, layer_, " is split over ", shards_,
                         " shards, but the job's tensor-parallel group has ", g->describe(),
                         ": start one process per shard (mpirun -np ", shards_, ")");
            group_ = g;
            devices_ = {"process " + std::to_string(g->shard()) + " of " + std::to_string(g->shards())};
            started_ = true;
            return;
        }
        const auto kind = std::is_same_v<P, place::Host> ? place::DeviceKind::Cpu : place::DeviceKind::Gpu;
        auto configured = place::list_logical_devices(kind);
        const bool scoped = int(configured.size()) >= shards_ && shards_ > 1;
        const int cores = std::max(1, num_threads() / shards_);
        std::vector<place::LogicalDevice> devices;
        for (int j = 0; j < shards_; ++j) {
            if (scoped) devices.push_back(configured[std::size_t(j)]);
            devices_.push_back(scoped ? configured[std::size_t(j)].name : "/device:CPU:0/shard:" + std::to_string(j));
        }
        pool_ = std::make_shared<ReplicaPool>(shards_, [devices, scoped, cores](int j) {
            if (scoped) {
                thread_local std::optional<place::DeviceScope> scope;  // lives as long as the shard's thread
                scope.emplace(devices[std::size_t(j)]);
            } else {
                set_num_threads(cores);
            }
        }, /*always_threads=*/true);
        started_ = true;
    }

    template <class T>
    std::vector<T>& packed_buffer() {
        if constexpr (std::is_same_v<T, float>) return packed_f_;
        else return packed_d_;
    }

    int shards_;
    const char* layer_;
    bool started_ = false;
    ShardGroup* group_ = nullptr;
    std::vector<std::int64_t> counts_;  // gather: the values of each shard's blocks
    std::vector<float> packed_f_;       // gather: the blocks, packed shard by shard
    std::vector<double> packed_d_;
    std::shared_ptr<ReplicaPool> pool_;
    std::vector<std::string> devices_;
};

/// The sum over shards of their parts part(j) into `out`: in shard order on one process (the
/// same sum every run), or this process's part summed over the processes.
template <class T, class P, class Part>
void sum_over_shards(ShardPool<P>& pool, int shards, Part part, const TensorView<T, P>& out, const char* what) {
    if (pool.across()) {
        copy(part(pool.shard()), out);
        pool.sum(out.data(), out.size(), what);
        return;
    }
    copy(part(0), out);
    for (int j = 1; j < shards; ++j) axpy(T(1), part(j), out);
}
}  // namespace detail

/// A Dense layer split over `Shards` threads/devices along `Axis` (Columns or Rows); see the file
/// comment. Requires 1 <= Shards <= the split dimension (Units for Columns, the input size for Rows).
template <std::int64_t Units, class Act, int Shards, class Axis>
struct TensorParallelDense {
    static_assert(Units >= 1, "strata::distribute::TensorParallelDense<Units>: Units must be >= 1");
    static_assert(Shards >= 1, "strata::distribute::TensorParallelDense<Units, Act, Shards>: Shards must be >= 1");
    static_assert(std::is_same_v<Axis, Columns> || std::is_same_v<Axis, Rows>,
                  "strata::distribute::TensorParallelDense<Units, Act, Shards, Axis>: Axis must be distribute::Columns or distribute::Rows");
    static_assert(!std::is_same_v<Axis, Columns> || Shards <= Units,
                  "strata::distribute::TensorParallelDense: more column shards than units (output columns)");
    static constexpr const char* name = "TensorParallelDense";
    static constexpr const char* keras_name = "dense";  // its variables are a Dense layer's
    using activation = Act;
    template <class In, class T, class P>
    using bind = detail::TensorParallelDenseImpl<Units, Act, Shards, Axis, false, In, T, P>;
};

/// `TokenDense<Units, Act>` split over `Shards` threads/devices along `Axis`: the kernel applied to
/// every token of [tokens, features] examples, as TensorParallelDense splits Dense (the same
/// variables and names as TokenDense, "dense/kernel" and "dense/bias"). A transformer's MLP is
/// Megatron's pair, `TensorParallelTokenDense<Hidden, GELU, N, Columns>` then
/// `TensorParallelTokenDense<Features, Linear, N, Rows>`: both split the hidden features the same
/// way (shard j of the first computes the columns shard j of the second reads), so the only sums
/// over shards are the second's output forward and the first's input gradient backward, one
/// each way (Shoeybi et al. 2019, §3, the MLP's f and g). Between the two the hidden activations
/// stay in the shared [rows, Hidden] buffer, each shard writing and reading its own columns.
///
/// \code
/// using Mlp = Residual<LayerNormalization<>, TensorParallelTokenDense<128, GELU, 2, Columns>,
///                      TensorParallelTokenDense<64, Linear, 2, Rows>>;   // on Input<49, 64>
/// \endcode
template <std::int64_t Units, class Act, int Shards, class Axis>
struct TensorParallelTokenDense {
    static_assert(Units >= 1, "strata::distribute::TensorParallelTokenDense<Units>: Units must be >= 1");
    static_assert(Shards >= 1, "strata::distribute::TensorParallelTokenDense<Units, Act, Shards>: Shards must be >= 1");
    static_assert(std::is_same_v<Axis, Columns> || std::is_same_v<Axis, Rows>,
                  "strata::distribute::TensorParallelTokenDense<Units, Act, Shards, Axis>: Axis must be distribute::Columns or "
                  "distribute::Rows");
    static_assert(!std::is_same_v<Axis, Columns> || Shards <= Units,
                  "strata::distribute::TensorParallelTokenDense: more column shards than units (output columns)");
    static constexpr const char* name = "TensorParallelTokenDense";
    static constexpr const char* keras_name = "dense";  // its variables are a Dense layer's
    using activation = Act;
    template <class In, class T, class P>
    using bind = detail::TensorParallelDenseImpl<Units, Act, Shards, Axis, true, In, T, P>;
};

namespace detail {

// The features a (token-)dense layer multiplies: the last axis per token, the whole example
// otherwise.
template <bool PerToken, class In>
constexpr std::int64_t split_dense_inputs() {
    if constexpr (PerToken && In::rank >= 1) return In::dims[In::rank - 1];
    else return In::size;
}

template <std::int64_t Units, class Act, int Shards, class Axis, bool PerToken, class In, class T, class P>
class TensorParallelDenseImpl {
    static_assert(nn::LayerShapeError<TensorParallelTokenDense<Units, Act, Shards, Axis>, nn::AnyShapeOfRank<2>, In,
                                      (!PerToken || In::rank >= 2)>::value,
                  "strata::distribute::TensorParallelTokenDense: the input must have a token axis and a feature axis (rank >= 2 "
                  "per example); on a flat input write TensorParallelDense");
    static constexpr bool by_columns = std::is_same_v<Axis, Columns>;

public:
    using input_shape = In;
    /// The per-token layer carries the token mask (nn::TokenMask); the flat one has no tokens.
    static constexpr nn::TokenMask token_mask = PerToken ? nn::TokenMask::Passes : nn::TokenMask::Unsupported;
    using output_shape = std::conditional_t<PerToken, typename nn::detail::ReplaceLast<In, Units>::type, StaticShape<Units>>;
    /// The features multiplied: a token's (the last axis), or the whole example's.
    static constexpr std::int64_t inputs = split_dense_inputs<PerToken, In>();
    /// The rows an example is (its tokens; 1 for the flat layer).
    static constexpr std::int64_t tokens = In::size / inputs;

private:
    using Plain = nn::detail::DenseImpl<Units, Act, true, std::conditional_t<PerToken, StaticShape<inputs>, In>, T, P>;

public:
    static constexpr std::int64_t kernel_size = inputs * Units;
    static constexpr std::int64_t num_params = Plain::num_params;
    static_assert(by_columns || Shards <= inputs, "strata::distribute::TensorParallelDense: more row shards than input features");

    static std::vector<nn::ParamInfo> param_info() { return Plain::param_info(); }
    void init(T* params, std::uint64_t seed, std::uint64_t stream) const { Plain().init(params, seed, stream); }

    /// Megatron's pair (Shoeybi et al. 2019, §3, the MLP's f and g): a column-parallel layer
    /// with a value-by-value activation (not Softmax, which needs the whole row) whose output the
    /// next layer, row-parallel and split the same way (the same shards over the same features
    /// and tokens), reads as it is. Across processes the pair then skips the column layer's
    /// all-gather forward and the row layer's backward: each process's hidden columns, biased and
    /// activated there, and their gradient stay where they were computed, and the other columns
    /// are zeros, which neither layer reads. (Called by Network and Residual: nn::link_neighbours.)
    template <class Next>
    void link_next(Next& next) {
        if constexpr (by_columns && !Act::rowwise && requires { next.take_split_input(Shards, Units, tokens); })
            paired_ = next.take_split_input(Shards, Units, tokens);
    }
    /// The row-parallel side of link_next: whether this layer reads its input split as it comes
    /// (`shards` shards of `features` features per token, `rows_per_example` tokens).
    bool take_split_input(int shards, std::int64_t features, std::int64_t rows_per_example)
        requires(!by_columns)
    {
        split_input_ = shards == Shards && features == inputs && rows_per_example == tokens;
        return split_input_;
    }
    void forward(const T* params, const TensorView<T, P>& x, const TensorView<T, P>& y, const nn::Mode& mode) {
        const std::int64_t n = x.dim(0) * tokens;  // rows
        const TensorView<T, P> ym(y.data(), Shape{n, Units});
        run([&](int j) {
            Shard& s = shards_[std::size_t(j)];
            const auto [first, count] = part(j);
            if constexpr (by_columns) {
                // W_j: the kernel's columns [first, first + count), gathered on this shard.
                s.w.resize(Shape{inputs, count});
                each_index<P>(inputs * count, GatherColumns<T>{params, s.w.data(), Units, first, count});
                s.y.resize(Shape{n, count});
                gemm(Trans::No, Trans::No, T(1), TensorView<T, P>(x.data(), Shape{n, inputs}), s.w.view(), T(0), s.y.view());
                // Paired across processes, this shard's columns only are biased and activated.
                if (split_here()) nn::detail::dense_bias_activation<Act>(s.y.view(), params + kernel_size + first, count, mode, pre_);
                if (split_here()) fill(ym, T(0));  // paired: the other processes' columns, zero (not read)
                each_index<P>(n * count, ScatterColumns<T>{s.y.data(), y.data(), Units, first, count});  // all-gather
            } else {
                // X_j: the input's features [first, first + count); W_j: kernel rows, contiguous.
                s.x.resize(Shape{n, count});
                each_index<P>(n * count, GatherColumns<T>{x.data(), s.x.data(), inputs, first, count});
                s.y.resize(Shape{n, Units});
                gemm(Trans::No, Trans::No, T(1), s.x.view(), TensorView<T, P>(const_cast<T*>(params) + first * Units, Shape{count, Units}),
                     T(0), s.y.view());
            }
            P::synchronize();
        });
        if constexpr (by_columns) {
            if (split_here()) return;  // biased and activated above
            if (pool_.across())
                pool_.gather(y.data(), [&](int j, auto&& f) { f(SplitBlock{0, n, Units, part(j).first, part(j).count}); },
                             "tensor-parallel dense forward (all-gather)");
        } else {  // reduce
            sum_over_shards(pool_, Shards, [&](int j) { return shards_[std::size_t(j)].y.view(); }, ym, "tensor-parallel dense forward (reduce)");
        }
        nn::detail::dense_bias_activation<Act>(ym, params + kernel_size, Units, mode, pre_);
    }

    void backward(const T* params, T* grads, const TensorView<T, P>& x, const TensorView<T, P>& y, const TensorView<T, P>& dy,
                  const TensorView<T, P>& dx, const nn::Mode& mode) {
        const std::int64_t n = x.dim(0) * tokens;  // rows
        const TensorView<T, P> dym(dy.data(), Shape{n, Units});
        const char* name = PerToken ? "TensorParallelTokenDense" : "TensorParallelDense";
        if (!split_here())  // (paired across processes: this shard's columns, below)
            nn::detail::dense_activation_backward<Act>(TensorView<T, P>(y.data(), Shape{n, Units}), dym, grads + kernel_size, Units, mode,
                                                       pre_, name);
        const bool want_dx = !dx.empty();
        // Across processes each shard writes its part of the kernel's gradient, and of a paired
        // column layer's bias gradient; the others' are gathered below.
        run([&](int j) {
            Shard& s = shards_[std::size_t(j)];
            const auto [first, count] = part(j);
            if constexpr (by_columns) {
                s.dy.resize(Shape{n, count});
                each_index<P>(n * count, GatherColumns<T>{dy.data(), s.dy.data(), Units, first, count});
                if (split_here())  // this shard's columns: s.y holds their activated output
                    nn::detail::dense_activation_backward<Act>(s.y.view(), s.dy.view(), grads + kernel_size + first, count, mode, pre_, name);
                s.dw.resize(Shape{inputs, count});
                gemm(Trans::Yes, Trans::No, T(1), TensorView<T, P>(x.data(), Shape{n, inputs}), s.dy.view(), T(0), s.dw.view());
                each_index<P>(inputs * count, ScatterColumns<T>{s.dw.data(), grads, Units, first, count});
                if (want_dx) {  // this shard's part of dX, reduced below
                    s.dx.resize(Shape{n, inputs});
                    gemm(Trans::No, Trans::Yes, T(1), s.dy.view(), s.w.view(), T(0), s.dx.view());
                }
            } else {
                gemm(Trans::Yes, Trans::No, T(1), s.x.view(), dym, T(0), TensorView<T, P>(grads + first * Units, Shape{count, Units}));
                if (want_dx) {  // the input gradient's features [first, first + count): all-gathered
                    if (split_input_ && pool_.across()) fill(TensorView<T, P>(dx.data(), Shape{n, inputs}), T(0));  // (not read)
                    s.dx.resize(Shape{n, count});
                    gemm(Trans::No, Trans::Yes, T(1), dym, TensorView<T, P>(const_cast<T*>(params) + first * Units, Shape{count, Units}),
                         T(0), s.dx.view());
                    each_index<P>(n * count, ScatterColumns<T>{s.dx.data(), dx.data(), inputs, first, count});
                }
            }
            P::synchronize();
        });
        const TensorView<T, P> dxm(dx.data(), Shape{n, inputs});
        if constexpr (by_columns) {
            if (want_dx)
                sum_over_shards(pool_, Shards, [&](int j) { return shards_[std::size_t(j)].dx.view(); }, dxm,
                                "tensor-parallel dense backward (input gradient, reduce)");
        } else {
            if (want_dx && pool_.across() && !split_input_)
                pool_.gather(dx.data(), [&](int j, auto&& f) { f(SplitBlock{0, n, inputs, part(j).first, part(j).count}); },
                             "tensor-parallel dense backward (input gradient, all-gather)");
        }
        if (pool_.across())
            pool_.gather(grads, [&](int j, auto&& f) { split_grad_blocks(j, f); }, "tensor-parallel dense backward (gradients, all-gather)");
    }

    /// The logical devices the shards run on (names), once the layer has run.
    std::vector<std::string> shard_devices() const { return pool_.devices(); }

private:
    struct Shard {
        Tensor<T, P> w, x, y, dy, dw, dx;
    };
    static ShardPart part(int j) { return shard_part(by_columns ? Units : inputs, Shards, j); }
    // Shard j's part of the variables' gradient (across processes): its kernel columns, and a
    // paired column layer's bias slice; or its kernel rows.
    template <class Emit>
    void split_grad_blocks(int j, Emit&& f) const {
        const auto [first, count] = part(j);
        if constexpr (by_columns) {
            f(SplitBlock{0, inputs, Units, first, count});
            if (paired_) f(SplitBlock{kernel_size, 1, Units, first, count});
        } else {
            f(SplitBlock{first * Units, 1, count * Units, 0, count * Units});
        }
    }
    template <class F>
    void run(F&& f) {
        pool_.run(f);
    }

    ShardPool<P> pool_{Shards, PerToken ? "TensorParallelTokenDense" : "TensorParallelDense"};
    bool paired_ = false;       // column-parallel, its output read split by the next layer (link_next)
    bool split_input_ = false;  // row-parallel, its input read split from the previous layer
    // This process holds only its shard's columns of the output (column-parallel, paired, across
    // processes): they are biased, activated and differentiated on the shard's own [n, count].
    bool split_here() const { return by_columns && paired_ && pool_.across(); }
    std::vector<Shard> shards_ = std::vector<Shard>(std::size_t(Shards));
    [[no_unique_address]] nn::detail::PreActivation<Act, T, P> pre_;  // GELU's input, for backward
};

}  // namespace detail
}  // namespace strata::distribute
