#pragma once
/// \file strata/distribute/ps_shards.hpp
/// What a parameter server's servers and workers hold: a server's shards as one compact buffer
/// with their optimizer slots and the inbox of pushes for the open update (PsServer), and a
/// worker's copy of the variables with its gradient buffer (PsWorkerCopy). The copies between
/// a flat layout (the network's variables in order) and a server's compact one are here; who
/// sends them where is PsTransport's (ps_transport.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/distribute/gradient_path.hpp"
#include "strata/distribute/partitioner.hpp"

namespace strata::distribute::detail {

/// A server: its shards (ranges of the flat layout) as one compact buffer, shard after shard
/// in plan order, their optimizer slots, and the pushes received for the open update.
template <class P, class T>
struct PsServer {
    std::vector<ShardRange> ranges;
    std::vector<std::int64_t> compact;  // where each range starts in the compact buffers
    std::int64_t size = 0;
    Tensor<T, P> params;
    optim::OptimizerState<T, P> opt;
    std::vector<Tensor<T, P>> inbox;  // messages; reused across updates
    int received = 0;

    /// The compact buffer `from` into the flat layout `out` (host).
    void gather(const Tensor<T, P>& from, std::vector<T>& out) const {
        if (size == 0) return;
        const auto v = to_vector(const_cast<Tensor<T, P>&>(from).view());
        for (std::size_t i = 0; i < ranges.size(); ++i) std::copy_n(v.begin() + compact[i], ranges[i].count, out.begin() + ranges[i].first);
    }
    /// The flat layout `flat` (host) into the compact buffer `to`.
    void scatter(const std::vector<T>& flat, Tensor<T, P>& to) const {
        for (std::size_t i = 0; i < ranges.size(); ++i)
            copy(TensorView<T, place::Host>(const_cast<T*>(flat.data()) + ranges[i].first, Shape{ranges[i].count}),
                 TensorView<T, P>(to.data() + compact[i], Shape{ranges[i].count}));
    }
    /// The next inbox message, grown on first use.
    Tensor<T, P>& next_message() {
        if (int(inbox.size()) <= received) inbox.emplace_back(Shape{size});
        return inbox[std::size_t(received++)];
    }
    /// Applies the open update: the inbox's sum times `inv` (1 / the update's examples).
    void apply_inbox(T inv) {
        if (!reduce_inbox(inv)) return;
        opt.apply(params.data(), inbox[0].data());
        received = 0;
    }
    /// The open update's gradient into the first message's buffer (the inbox's sum times
    /// `inv`); false when this server has nothing to apply. Then, where the optimizer needs the
    /// whole model's gradient first (global_clipnorm, a loss scale: opt.clips_gradients()),
    /// the caller sums reduced_squares() over every server and hands the sum to apply_reduced.
    bool reduce_inbox(T inv) {
        if (size == 0 || received == 0) return false;
        auto acc = inbox[0].view();
        for (int i = 1; i < received; ++i) axpy(T(1), inbox[std::size_t(i)].view(), acc);
        scale(acc, inv, acc);
        return true;
    }
    /// The sum of squares of the reduced update over this server's trainable elements (0 with
    /// nothing to apply).
    double reduced_squares() { return size == 0 || received == 0 ? 0.0 : opt.squared_gradient_norm(inbox[0].data()); }
    /// Applies the reduced update, clipped or skipped as the whole model's sum of squares
    /// `whole` says: every server takes the same decision from the same sum.
    void apply_reduced(double whole) {
        if (size == 0 || received == 0) return;
        opt.prepare_step_from_squared_norm(whole);
        opt.apply_range(params.data(), inbox[0].data(), 0, size);
        opt.advance();
        received = 0;
    }
};

/// A worker's copy of the variables (the version it pulled) and its gradient buffer.
template <class P, class T>
struct PsWorkerCopy {
    Tensor<T, P> params, grads;
    std::int64_t version = -1;  // the version its params hold
    std::uint64_t batches = 0;  // mini-batches started (the straggler draws' counter)
};

}  // namespace strata::distribute::detail
