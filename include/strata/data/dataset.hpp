#pragma once
/// \file strata/data/dataset.hpp
/// An in-memory input pipeline in the manner of tf.data: `from_arrays`, then `cache`, `shuffle`,
/// `map`, `augment`, `batch`, `repeat`, `take`, `prefetch`, each returning a new Dataset that
/// shares the steps before it.
///
/// \code
///   namespace sd = strata::data;
///   auto mnist = sd::load_mnist("data/mnist");
///   auto train = sd::from_arrays(std::move(mnist.train.images.data), {28, 28, 1},
///                                std::move(mnist.train.labels.data))
///                    .shuffle(60000, /*seed=*/42)
///                    .batch(128)
///                    .prefetch(2);
///   for (int epoch = 0; epoch < 10; ++epoch)
///       for (const auto& b : train.iterate(epoch)) step(b.x, b.y, b.size());
/// \endcode
///
/// Elements. Before `batch`, an element is one example: `example_size()` floats of x (shape
/// `example_shape()`), `y_per_example()` labels of type Y and, when the dataset carries sample
/// weights (`has_sample_weight()`), one float weight. After `batch(n)`, an element is up to n
/// examples, stored contiguously. Steps after `batch` (shuffle, map, take, ...) act on whole
/// batches, as in tf.data. Every step moves an example's weight with its x and y.
///
/// Passes and determinism. Every pass over a dataset has a 64-bit epoch number: `iterate(e)` uses
/// `e`; `begin()` (a range-for) uses 0, 1, 2, ... for the successive passes of this object. A
/// shuffle's order is a pure function of its seed and the pass (and, under `repeat`, of the
/// repetition), so a run is reproducible and resumable at any epoch, and every epoch and every
/// repetition is ordered differently. `prefetch` never reorders. `augment` (random crops and
/// flips of images, strata/data/augment.hpp) draws from the same pass number and the example's
/// position in the pass, so its images are reproducible too, and do not depend on how a
/// strategy later splits the batch among replicas.
///
/// Memory. Examples from `from_arrays` and `cache` are not copied until `batch` gathers them into
/// its batch buffer. Every step keeps its buffers for the whole iteration (and across the
/// repetitions of `repeat`), so after the first pass through the shuffle buffer and the first
/// batch an iteration allocates nothing per element; starting a pass allocates each step's state
/// once (and a thread for `prefetch`).
///
/// Threads. A Dataset is immutable and can be iterated by several threads at once, each with its
/// own iterator (map functions must then be thread-safe). An iterator belongs to one thread.
/// `prefetch` runs the steps before it on a background thread; its exceptions reach the consumer
/// at the element where they happened, and destroying an iterator stops and joins that thread,
/// even mid-epoch.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/random.hpp"
#include "strata/data/augment.hpp"
#include "strata/io/text.hpp"

namespace strata::data {

/// cardinality() of a dataset that never ends (`repeat()` with no count), as in tf.data.
inline constexpr std::int64_t infinite_cardinality = -1;
/// cardinality() of a dataset whose length cannot be known without iterating it, as in tf.data.
inline constexpr std::int64_t unknown_cardinality = -2;

/// The label types a Dataset can carry: class ids (`std::int32_t`, the default) or regression
/// targets (`float`, `double`), or any other arithmetic type except bool.
template <class Y>
concept DatasetLabel = std::is_arithmetic_v<Y> && !std::same_as<Y, bool>;

template <DatasetLabel Y>
class Dataset;

/// One element of an iteration: `size()` examples with their inputs, labels and (when the
/// dataset has them) sample weights, contiguous.
///
/// `x` holds `size() * example_size()` floats (example i at `x[i * example_size()]`, each example
/// row-major with shape `example_shape()`); `y` holds `size() * y_per_example()` labels; `w`
/// holds `size()` weights (Keras's sample_weight; example i's is `w[i]`), or nothing when the
/// dataset is unweighted.
/// The spans point into the pipeline's buffers: they stay valid until the iterator that produced
/// them advances or is destroyed. Copy the data to keep it longer.
template <DatasetLabel Y = std::int32_t>
struct Batch {
    std::span<const float> x;  ///< inputs, example-major
    std::span<const Y> y;      ///< labels, example-major
    std::span<const float> w;  ///< sample weights, one per example; empty when the dataset has none

    /// Number of examples (the batch size; smaller for a last partial batch; 1 before batch()).
    std::size_t size() const noexcept { return count_; }
    /// Shape of one example's x (e.g. {28, 28, 1}).
    std::span<const std::size_t> example_shape() const noexcept { return shape_; }
    /// Floats per example: the product of example_shape().
    std::size_t example_size() const noexcept { return size() ? x.size() / size() : 0; }
    /// Labels per example.
    std::size_t y_per_example() const noexcept { return size() ? y.size() / size() : 0; }
    /// The inputs of example `i` < size().
    std::span<const float> x_at(std::size_t i) const noexcept { return x.subspan(i * example_size(), example_size()); }
    /// The labels of example `i` < size().
    std::span<const Y> y_at(std::size_t i) const noexcept { return y.subspan(i * y_per_example(), y_per_example()); }
    /// Whether the examples carry sample weights (`w` is not empty).
    bool has_sample_weight() const noexcept { return !w.empty(); }
    /// The weight of example `i` < size(): `w[i]`, or 1 when the dataset is unweighted (an
    /// example without a weight counts fully, as in Keras).
    float w_at(std::size_t i) const noexcept { return w.empty() ? 1.0f : w[i]; }

private:
    friend class Dataset<Y>;  // its Iterator fills these in
    std::size_t count_ = 0;
    std::span<const std::size_t> shape_{};
};


// The pipeline's steps (stages and the nodes that make them), defined after Dataset below: here
// only what the public class names.
namespace detail::ds {
template <class Y>
class Node;
template <class Y>
using NodePtr = std::shared_ptr<const Node<Y>>;
template <class Y>
using MapFn = std::function<void(std::span<float>, std::span<Y>)>;
template <class Y>
class MapNode;
}  // namespace detail::ds

/// An input pipeline over in-memory examples, built step by step like a tf.data.Dataset.
///
/// A Dataset is a cheap, immutable handle (copying it shares the steps); each method returns a
/// new Dataset with one more step. Iterating it yields Batch<Y> elements (see the file comment
/// for elements, passes, determinism, memory and threads).
///
/// Requires: Y satisfies DatasetLabel (int32 class ids by default; float for regression).
template <DatasetLabel Y = std::int32_t>
class Dataset {
public:
    using label_type = Y;
    using element_type = Batch<Y>;

    class Iterator;

    /// A dataset of the examples in `x` with labels in `y` and, optionally, one weight per
    /// example in `sample_weight` (Keras's sample_weight, tf.data's `(x, y, sample_weight)`
    /// elements): Model::fit multiplies each example's loss and gradient by its weight, and
    /// evaluate its loss. Empty `sample_weight` (the default): an unweighted dataset.
    ///
    /// Requires: `example_shape` has a non-zero product E (ShapeError otherwise); `x.size()` is a
    ///   multiple of E; `y_per_example` >= 1 (ValueError); `y.size()` == (x.size() / E) ×
    ///   y_per_example (ShapeError naming both counts); `sample_weight` empty or holding
    ///   x.size() / E weights (ShapeError naming both counts), each finite and >= 0 (ValueError
    ///   naming the index and the value).
    /// Ensures: cardinality() == x.size() / E; has_sample_weight() == !sample_weight.empty();
    ///   the arrays are moved in, never copied again.
    ///
    /// \code
    ///   auto ds = strata::data::Dataset<>::from_arrays(std::move(pixels), {28, 28, 1}, std::move(labels));
    ///   auto weighted = strata::data::Dataset<>::from_arrays(std::move(pixels), {28, 28, 1}, std::move(labels),
    ///                                                        std::move(weights));   // one float per example
    /// \endcode
    static Dataset from_arrays(std::vector<float> x, std::vector<std::size_t> example_shape, std::vector<Y> y,
                               std::size_t y_per_example = 1, std::vector<float> sample_weight = {});

    /// from_arrays with one label per example and a weight for each:
    /// `from_arrays(x, shape, y, sample_weight)` is `from_arrays(x, shape, y, 1, sample_weight)`.
    static Dataset from_arrays(std::vector<float> x, std::vector<std::size_t> example_shape, std::vector<Y> y,
                               std::vector<float> sample_weight);

    /// Shuffles elements with a buffer of `buffer_size` (tf.data's algorithm: fill the buffer,
    /// emit a uniformly random element of it and replace it with the next input). A buffer at
    /// least as large as the dataset gives a uniform random permutation; a smaller one only
    /// mixes nearby elements. The order depends only on `seed` and the pass (see the file
    /// comment): the same for the same epoch, different across epochs and repetitions.
    /// Requires: buffer_size >= 1 (ValueError). The buffer holds references to stable examples
    /// (from from_arrays or cache) and copies of anything else.
    Dataset shuffle(std::size_t buffer_size, std::uint64_t seed) const;

    /// Groups `n` consecutive examples into one element; the last batch holds the remainder
    /// unless `drop_remainder`, which drops it.
    /// Requires: n >= 1 (ValueError); the dataset is not batched already (ValueError).
    /// Ensures: cardinality() is ceil(N / n), or floor(N / n) with `drop_remainder`.
    Dataset batch(std::size_t n, bool drop_remainder = false) const;

    /// Repeats the dataset `count` times, or forever when `count` is -1 (the default). Each
    /// repetition is a new pass for the steps before it (a shuffle reshuffles). An empty input
    /// ends the repetition instead of spinning.
    /// Requires: count >= -1 (ValueError).
    Dataset repeat(std::int64_t count = -1) const;

    /// Applies `fn(x, y)` to a copy of every element, which it may edit in place: before batch()
    /// the spans hold one example, after it a whole batch (`x.size() / example_size()` examples).
    /// Sample weights are not passed to `fn`: they stay with their examples, unchanged.
    /// `fn` runs once per element per pass (see cache()); exceptions it throws reach the
    /// iterating code. It must be thread-safe if several iterators (or prefetch) run it at once.
    ///
    /// \code
    ///   auto centered = ds.map([](std::span<float> x, std::span<std::int32_t>) { for (auto& v : x) v -= 0.5f; });
    /// \endcode
    template <class F>
        requires std::invocable<F&, std::span<float>, std::span<Y>>
    Dataset map(F fn) const {
        auto f = std::make_shared<const detail::ds::MapFn<Y>>(std::move(fn));
        return with(std::make_shared<detail::ds::MapNode<Y>>(node_, std::move(f), es_, yp_), cardinality_);
    }

    /// Augments images: each example, of shape {H, W, C} (channels last), is zero-padded by
    /// `a.pad` pixels on each side and cropped back to H x W at a random offset (each of dy, dx
    /// uniform in [0, 2 pad]), then mirrored left-right with probability 1/2 when `a.flip`
    /// (strata/data/augment.hpp has the exact formula, augment_image). Labels and sample weights
    /// are unchanged.
    ///
    /// The draws for an example are a pure function of `a.seed`, the pass (the epoch given to
    /// iterate; under a later `repeat`, the repetition too) and the example's position in the
    /// pass as this step sees it (after the shuffles before it): augment_draw(a, epoch,
    /// position). Not of the batch, the thread, or how many replicas share a batch: a strategy
    /// splits batches that are already augmented, so N replicas see exactly what one device
    /// sees. The same draws before `batch` as after it. Each epoch gives other crops and flips.
    ///
    /// Augment the training data only: evaluate and predict read whatever dataset they are
    /// given, so give them one without this step (augmented() tells). Put it after `cache`
    /// (a cache replays the first pass's images every epoch). After the first element of a pass
    /// the step allocates nothing: it keeps one buffer of the largest element.
    /// `{.pad = 0, .flip = false}` passes every element through unchanged, bit for bit.
    ///
    /// Requires: the example shape is {H, W, C} (rank 3, ShapeError naming the shape found);
    /// 0 <= a.pad < min(H, W) (ValueError naming the pad and the image size).
    ///
    /// \code
    ///   auto train = sd::from_arrays(std::move(x), {28, 28, 1}, std::move(y))
    ///                    .shuffle(60000, 42).augment({.pad = 4, .flip = true, .seed = 1}).batch(128);
    /// \endcode
    Dataset augment(const Augment& a) const;

    /// Whether an augment() step is part of this pipeline (evaluation data should not have one).
    bool augmented() const noexcept { return augmented_; }

    /// Keeps every element of the first complete pass in memory and replays them in later
    /// passes, so the steps before it (a map, say) run once. A pass that stops early (take, an
    /// iterator destroyed mid-way) caches nothing, as in tf.data. Later passes replay the first
    /// pass's order: put shuffle after cache. Caching an infinite dataset exhausts memory.
    Dataset cache() const;

    /// Runs the steps before it on a background thread that keeps up to `k` elements ready, so
    /// the next batch is waiting when a training step ends. Same elements, same order.
    /// Requires: k >= 1 (ValueError).
    Dataset prefetch(std::size_t k = 1) const;

    /// The first `n` elements (all of them when n is -1).
    /// Requires: n >= -1 (ValueError).
    Dataset take(std::int64_t n) const;

    /// The number of elements a pass yields (batches after batch(), examples before), or
    /// infinite_cardinality, or unknown_cardinality.
    std::int64_t cardinality() const noexcept { return cardinality_; }
    /// Shape of one example's x.
    const std::vector<std::size_t>& example_shape() const noexcept { return *shape_; }
    /// Floats per example (product of example_shape()).
    std::size_t example_size() const noexcept { return es_; }
    /// Labels per example.
    std::size_t y_per_example() const noexcept { return yp_; }
    /// The batch size given to batch(), or 0 when the dataset is not batched.
    std::size_t batch_size() const noexcept { return batch_; }
    /// Whether every example carries a sample weight (from_arrays was given them); every step
    /// keeps this, and each Batch's `w` then holds its examples' weights.
    bool has_sample_weight() const noexcept { return wp_ != 0; }

    /// Starts pass number `epoch`: an iterator at its first element (or at its end).
    /// The same epoch always gives the same elements in the same order.
    Iterator iterate(std::uint64_t epoch) const { return Iterator(*this, epoch); }

    /// Starts the next pass of this object (epochs 0, 1, 2, ... in order of calls), so that
    /// successive range-for loops see successive epochs. Not thread-safe for one object; use
    /// iterate(epoch) to choose the epoch.
    Iterator begin() const { return iterate(next_epoch_++); }
    /// The end of any pass.
    std::default_sentinel_t end() const noexcept { return std::default_sentinel; }

private:
    detail::ds::NodePtr<Y> node_;
    std::shared_ptr<const std::vector<std::size_t>> shape_;
    std::size_t es_ = 0, yp_ = 0, wp_ = 0, batch_ = 0;  // wp_: weights per example, 1 or 0
    std::int64_t cardinality_ = 0;
    bool augmented_ = false;
    mutable std::uint64_t next_epoch_ = 0;

    Dataset() = default;

    Dataset with(detail::ds::NodePtr<Y> node, std::int64_t cardinality) const {
        Dataset d = *this;
        d.node_ = std::move(node);
        d.cardinality_ = cardinality;
        d.next_epoch_ = 0;
        return d;
    }
};

// ---- the pipeline's steps: what each Dataset method adds, and the stage it runs ----

namespace detail::ds {

// A reference to one element a stage produced. `stable`: the memory stays valid as long as the
// stage tree exists (it is the dataset's own array or a finished cache), so a shuffle buffer may
// hold the reference instead of a copy. Otherwise it is valid until the stage's next call.
// `w`: the examples' weights, `count * wp` floats where wp (weights per example) is 1 for a
// weighted dataset and 0 otherwise; stages copy `count * wp` of them as they copy x and y, so
// an unweighted pipeline copies (and allocates) nothing for them.
template <class Y>
struct ElementRef {
    const float* x = nullptr;
    const Y* y = nullptr;
    const float* w = nullptr;
    std::size_t count = 0;
    bool stable = false;
};

// The running state of one step during one iteration.
template <class Y>
class Stage {
public:
    virtual ~Stage() = default;
    // Begins (or restarts) a pass; `key` selects the pass's randomness.
    virtual void start(std::uint64_t key) = 0;
    // The next element, or false at the end of the pass.
    virtual bool next(ElementRef<Y>& out) = 0;
};

// An immutable step of a pipeline; makes the Stage that runs it.
template <class Y>
class Node {
public:
    virtual ~Node() = default;
    virtual std::unique_ptr<Stage<Y>> make_stage() const = 0;
};


// SplitMix64's finalizer (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014): spreads (pass, repetition) into unrelated 64-bit keys.
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) noexcept {
    std::uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <class T>
void copy_n(T* dst, const T* src, std::size_t n) noexcept {
    if (n) std::memcpy(dst, src, n * sizeof(T));
}

// ---- from_arrays ----

template <class Y>
struct Arrays {
    std::vector<float> x;
    std::vector<Y> y;
    std::vector<float> w;  // empty, or one weight per example
    std::size_t count, es, yp, wp;
};

template <class Y>
class SourceStage final : public Stage<Y> {
public:
    explicit SourceStage(std::shared_ptr<const Arrays<Y>> a) : a_(std::move(a)) {}
    void start(std::uint64_t) override { i_ = 0; }
    bool next(ElementRef<Y>& out) override {
        if (i_ >= a_->count) return false;
        out = {a_->x.data() + i_ * a_->es, a_->y.data() + i_ * a_->yp, a_->w.data() + i_ * a_->wp, 1, true};
        ++i_;
        return true;
    }

private:
    std::shared_ptr<const Arrays<Y>> a_;
    std::size_t i_ = 0;
};

template <class Y>
class SourceNode final : public Node<Y> {
public:
    explicit SourceNode(std::shared_ptr<const Arrays<Y>> a) : a_(std::move(a)) {}
    std::unique_ptr<Stage<Y>> make_stage() const override { return std::make_unique<SourceStage<Y>>(a_); }

private:
    std::shared_ptr<const Arrays<Y>> a_;
};

// ---- shuffle: the tf.data algorithm (a buffer of `size` elements; emit a uniformly chosen one
// and put the next input element in its place; drain at the end) ----

template <class Y>
class ShuffleStage final : public Stage<Y> {
public:
    ShuffleStage(std::unique_ptr<Stage<Y>> up, std::size_t size, std::uint64_t seed, std::size_t es, std::size_t yp,
                 std::size_t wp)
        : up_(std::move(up)), size_(size), seed_(seed), es_(es), yp_(yp), wp_(wp) {}

    void start(std::uint64_t key) override {
        rng_ = random::Generator(seed_, key);
        live_ = 0;
        pending_ = none;
        filled_ = false;
        up_done_ = false;
        up_->start(key);
    }

    bool next(ElementRef<Y>& out) override {
        if (!filled_) {
            filled_ = true;
            while (live_ < size_ && pull(live_)) ++live_;
        } else if (pending_ != none) {
            // The slot emitted last time is refilled only now, because its element had to stay
            // valid until this call.
            if (!pull(pending_)) {
                std::swap(slots_[pending_], slots_[live_ - 1]);
                --live_;
            }
            pending_ = none;
        }
        if (live_ == 0) return false;
        pending_ = static_cast<std::size_t>(rng_.below(live_));
        out = slots_[pending_].ref;
        return true;
    }

private:
    struct Slot {
        ElementRef<Y> ref;
        std::vector<float> xs;  // a copy, for elements that are not stable
        std::vector<Y> ys;
        std::vector<float> ws;
    };
    static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

    std::unique_ptr<Stage<Y>> up_;
    std::size_t size_;
    std::uint64_t seed_;
    std::size_t es_, yp_, wp_;
    random::Generator rng_;
    std::vector<Slot> slots_;  // slots beyond live_ are spares, kept for their capacity
    std::size_t live_ = 0;
    std::size_t pending_ = none;
    bool filled_ = false;
    bool up_done_ = false;

    // Stores the next input element in slot i; false when the input is exhausted.
    bool pull(std::size_t i) {
        if (up_done_) return false;
        ElementRef<Y> e;
        if (!up_->next(e)) {
            up_done_ = true;
            return false;
        }
        if (i == slots_.size()) slots_.emplace_back();
        Slot& s = slots_[i];
        if (e.stable) {
            s.ref = e;
        } else {
            s.xs.assign(e.x, e.x + e.count * es_);
            s.ys.assign(e.y, e.y + e.count * yp_);
            s.ws.assign(e.w, e.w + e.count * wp_);
            s.ref = {s.xs.data(), s.ys.data(), s.ws.data(), e.count, false};
        }
        return true;
    }
};

template <class Y>
class ShuffleNode final : public Node<Y> {
public:
    ShuffleNode(NodePtr<Y> up, std::size_t size, std::uint64_t seed, std::size_t es, std::size_t yp, std::size_t wp)
        : up_(std::move(up)), size_(size), seed_(seed), es_(es), yp_(yp), wp_(wp) {}
    std::unique_ptr<Stage<Y>> make_stage() const override {
        return std::make_unique<ShuffleStage<Y>>(up_->make_stage(), size_, seed_, es_, yp_, wp_);
    }

private:
    NodePtr<Y> up_;
    std::size_t size_;
    std::uint64_t seed_;
    std::size_t es_, yp_, wp_;
};

// ---- batch ----

template <class Y>
class BatchStage final : public Stage<Y> {
public:
    BatchStage(std::unique_ptr<Stage<Y>> up, std::size_t n, bool drop, std::size_t es, std::size_t yp, std::size_t wp)
        : up_(std::move(up)), n_(n), drop_(drop), es_(es), yp_(yp), wp_(wp), xs_(n * es), ys_(n * yp), ws_(n * wp) {}

    void start(std::uint64_t key) override { up_->start(key); }

    bool next(ElementRef<Y>& out) override {
        // While the examples are stable and adjacent in memory (an unshuffled array or cache),
        // the batch is a view of them; the first one that is not switches to copying.
        bool view = true;
        const float* vx = nullptr;
        const Y* vy = nullptr;
        const float* vw = nullptr;
        std::size_t k = 0;
        while (k < n_) {
            ElementRef<Y> e;
            if (!up_->next(e)) break;
            if (view) {
                // Weights must be adjacent too (with wp_ == 0 both sides are the same null).
                if (e.stable && (k == 0 || (e.x == vx + k * es_ && e.y == vy + k * yp_ && e.w == vw + k * wp_))) {
                    if (k == 0) {
                        vx = e.x;
                        vy = e.y;
                        vw = e.w;
                    }
                    ++k;
                    continue;
                }
                copy_n(xs_.data(), vx, k * es_);
                copy_n(ys_.data(), vy, k * yp_);
                copy_n(ws_.data(), vw, k * wp_);
                view = false;
            }
            copy_n(xs_.data() + k * es_, e.x, es_);
            copy_n(ys_.data() + k * yp_, e.y, yp_);
            copy_n(ws_.data() + k * wp_, e.w, wp_);
            ++k;
        }
        if (k == 0 || (k < n_ && drop_)) return false;
        out = view ? ElementRef<Y>{vx, vy, vw, k, true} : ElementRef<Y>{xs_.data(), ys_.data(), ws_.data(), k, false};
        return true;
    }

private:
    std::unique_ptr<Stage<Y>> up_;
    std::size_t n_;
    bool drop_;
    std::size_t es_, yp_, wp_;
    std::vector<float> xs_;
    std::vector<Y> ys_;
    std::vector<float> ws_;
};

template <class Y>
class BatchNode final : public Node<Y> {
public:
    BatchNode(NodePtr<Y> up, std::size_t n, bool drop, std::size_t es, std::size_t yp, std::size_t wp)
        : up_(std::move(up)), n_(n), drop_(drop), es_(es), yp_(yp), wp_(wp) {}
    std::unique_ptr<Stage<Y>> make_stage() const override {
        return std::make_unique<BatchStage<Y>>(up_->make_stage(), n_, drop_, es_, yp_, wp_);
    }

private:
    NodePtr<Y> up_;
    std::size_t n_;
    bool drop_;
    std::size_t es_, yp_, wp_;
};

// ---- repeat ----

template <class Y>
class RepeatStage final : public Stage<Y> {
public:
    RepeatStage(std::unique_ptr<Stage<Y>> up, std::int64_t count) : up_(std::move(up)), count_(count) {}

    void start(std::uint64_t key) override {
        key_ = key;
        rep_ = 0;
        produced_ = false;
        ended_ = count_ == 0;
        if (!ended_) up_->start(mix(key_, 0));
    }

    bool next(ElementRef<Y>& out) override {
        while (!ended_) {
            if (up_->next(out)) {
                produced_ = true;
                return true;
            }
            ++rep_;
            // An empty input would make an infinite repeat spin forever; tf.data ends it too.
            if (!produced_ || (count_ >= 0 && rep_ >= static_cast<std::uint64_t>(count_))) {
                ended_ = true;
                break;
            }
            produced_ = false;
            up_->start(mix(key_, rep_));
        }
        return false;
    }

private:
    std::unique_ptr<Stage<Y>> up_;
    std::int64_t count_;
    std::uint64_t key_ = 0, rep_ = 0;
    bool produced_ = false, ended_ = false;
};

template <class Y>
class RepeatNode final : public Node<Y> {
public:
    RepeatNode(NodePtr<Y> up, std::int64_t count) : up_(std::move(up)), count_(count) {}
    std::unique_ptr<Stage<Y>> make_stage() const override {
        return std::make_unique<RepeatStage<Y>>(up_->make_stage(), count_);
    }

private:
    NodePtr<Y> up_;
    std::int64_t count_;
};

// ---- map ----


template <class Y>
class MapStage final : public Stage<Y> {
public:
    MapStage(std::unique_ptr<Stage<Y>> up, std::shared_ptr<const MapFn<Y>> fn, std::size_t es, std::size_t yp)
        : up_(std::move(up)), fn_(std::move(fn)), es_(es), yp_(yp) {}
    void start(std::uint64_t key) override { up_->start(key); }
    bool next(ElementRef<Y>& out) override {
        ElementRef<Y> e;
        if (!up_->next(e)) return false;
        xs_.assign(e.x, e.x + e.count * es_);
        ys_.assign(e.y, e.y + e.count * yp_);
        (*fn_)(std::span<float>(xs_), std::span<Y>(ys_));
        // The function does not see the weights: they pass through uncopied (the upstream
        // element stays valid until this stage's next call, as this element must).
        out = {xs_.data(), ys_.data(), e.w, e.count, false};
        return true;
    }

private:
    std::unique_ptr<Stage<Y>> up_;
    std::shared_ptr<const MapFn<Y>> fn_;
    std::size_t es_, yp_;
    std::vector<float> xs_;
    std::vector<Y> ys_;
};

template <class Y>
class MapNode final : public Node<Y> {
public:
    MapNode(NodePtr<Y> up, std::shared_ptr<const MapFn<Y>> fn, std::size_t es, std::size_t yp)
        : up_(std::move(up)), fn_(std::move(fn)), es_(es), yp_(yp) {}
    std::unique_ptr<Stage<Y>> make_stage() const override {
        return std::make_unique<MapStage<Y>>(up_->make_stage(), fn_, es_, yp_);
    }

private:
    NodePtr<Y> up_;
    std::shared_ptr<const MapFn<Y>> fn_;
    std::size_t es_, yp_;
};

// ---- augment: random crop after zero padding, random horizontal flip (data/augment.hpp) ----

template <class Y>
class AugmentStage final : public Stage<Y> {
public:
    AugmentStage(std::unique_ptr<Stage<Y>> up, const Augment& a, std::size_t h, std::size_t w, std::size_t c)
        : up_(std::move(up)), a_(a), h_(h), w_(w), c_(c), es_(h * w * c) {}

    void start(std::uint64_t key) override {
        key_ = augment_pass_key(a_.seed, key);
        position_ = 0;
        up_->start(key);
    }

    bool next(ElementRef<Y>& out) override {
        ElementRef<Y> e;
        if (!up_->next(e)) return false;
        const std::uint64_t first = position_;
        position_ += e.count;
        if (a_.pad == 0 && !a_.flip) {  // nothing to do: the element itself, bit for bit
            out = e;
            return true;
        }
        // Grows to the largest element once (a batch), then is reused: no allocation per element.
        if (xs_.size() < e.count * es_) xs_.resize(e.count * es_);
        for (std::size_t i = 0; i < e.count; ++i)
            detail::augment_image_unchecked(e.x + i * es_, xs_.data() + i * es_, h_, w_, c_,
                                            static_cast<std::size_t>(a_.pad), augment_draw_keyed(a_, key_, first + i));
        // Labels and weights pass through uncopied (the upstream element stays valid until this
        // stage's next call, as this element must).
        out = {xs_.data(), e.y, e.w, e.count, false};
        return true;
    }

private:
    std::unique_ptr<Stage<Y>> up_;
    Augment a_;
    std::size_t h_, w_, c_, es_;
    std::uint64_t key_ = 0, position_ = 0;
    std::vector<float> xs_;
};

template <class Y>
class AugmentNode final : public Node<Y> {
public:
    AugmentNode(NodePtr<Y> up, const Augment& a, std::size_t h, std::size_t w, std::size_t c)
        : up_(std::move(up)), a_(a), h_(h), w_(w), c_(c) {}
    std::unique_ptr<Stage<Y>> make_stage() const override {
        return std::make_unique<AugmentStage<Y>>(up_->make_stage(), a_, h_, w_, c_);
    }

private:
    NodePtr<Y> up_;
    Augment a_;
    std::size_t h_, w_, c_;
};

// ---- cache ----

template <class Y>
struct CacheData {
    std::vector<float> xs;
    std::vector<Y> ys;
    std::vector<float> ws;            // empty when the dataset is unweighted
    std::vector<std::size_t> counts;  // examples per element
    std::vector<std::size_t> starts;  // first example of each element
};

// Shared by every Dataset copy that contains this cache() step, hence by all their iterators.
template <class Y>
struct CacheShared {
    std::mutex m;
    std::shared_ptr<const CacheData<Y>> data;  // set by the first pass that completes
};

template <class Y>
class CacheStage final : public Stage<Y> {
public:
    CacheStage(std::unique_ptr<Stage<Y>> up, std::shared_ptr<CacheShared<Y>> shared, std::size_t es, std::size_t yp,
               std::size_t wp, std::size_t reserve_examples)
        : up_(std::move(up)), shared_(std::move(shared)), es_(es), yp_(yp), wp_(wp), reserve_(reserve_examples) {}

    void start(std::uint64_t key) override {
        {
            std::lock_guard<std::mutex> lock(shared_->m);
            data_ = shared_->data;
        }
        i_ = 0;
        if (data_) return;
        // A pass that was not read to its end leaves an incomplete copy: it is dropped (tf.data).
        building_ = std::make_shared<CacheData<Y>>();
        building_->xs.reserve(reserve_ * es_);
        building_->ys.reserve(reserve_ * yp_);
        building_->ws.reserve(reserve_ * wp_);
        examples_ = 0;
        up_->start(key);
    }

    bool next(ElementRef<Y>& out) override {
        if (data_) {
            if (i_ >= data_->counts.size()) return false;
            const std::size_t s = data_->starts[i_];
            out = {data_->xs.data() + s * es_, data_->ys.data() + s * yp_, data_->ws.data() + s * wp_, data_->counts[i_], true};
            ++i_;
            return true;
        }
        if (!building_) return false;
        if (!up_->next(out)) {
            std::lock_guard<std::mutex> lock(shared_->m);
            if (!shared_->data) shared_->data = std::move(building_);
            building_.reset();
            return false;
        }
        auto& b = *building_;
        b.xs.insert(b.xs.end(), out.x, out.x + out.count * es_);
        b.ys.insert(b.ys.end(), out.y, out.y + out.count * yp_);
        b.ws.insert(b.ws.end(), out.w, out.w + out.count * wp_);
        b.counts.push_back(out.count);
        b.starts.push_back(examples_);
        examples_ += out.count;
        return true;
    }

private:
    std::unique_ptr<Stage<Y>> up_;
    std::shared_ptr<CacheShared<Y>> shared_;
    std::size_t es_, yp_, wp_, reserve_;
    std::shared_ptr<const CacheData<Y>> data_;
    std::shared_ptr<CacheData<Y>> building_;
    std::size_t i_ = 0, examples_ = 0;
};

template <class Y>
class CacheNode final : public Node<Y> {
public:
    CacheNode(NodePtr<Y> up, std::size_t es, std::size_t yp, std::size_t wp, std::size_t reserve_examples)
        : up_(std::move(up)), shared_(std::make_shared<CacheShared<Y>>()), es_(es), yp_(yp), wp_(wp),
          reserve_(reserve_examples) {}
    std::unique_ptr<Stage<Y>> make_stage() const override {
        return std::make_unique<CacheStage<Y>>(up_->make_stage(), shared_, es_, yp_, wp_, reserve_);
    }

private:
    NodePtr<Y> up_;
    std::shared_ptr<CacheShared<Y>> shared_;
    std::size_t es_, yp_, wp_, reserve_;
};

// ---- take ----

template <class Y>
class TakeStage final : public Stage<Y> {
public:
    TakeStage(std::unique_ptr<Stage<Y>> up, std::int64_t n) : up_(std::move(up)), n_(n) {}
    void start(std::uint64_t key) override {
        taken_ = 0;
        up_->start(key);
    }
    bool next(ElementRef<Y>& out) override {
        if (n_ >= 0 && taken_ >= static_cast<std::uint64_t>(n_)) return false;
        if (!up_->next(out)) return false;
        ++taken_;
        return true;
    }

private:
    std::unique_ptr<Stage<Y>> up_;
    std::int64_t n_;
    std::uint64_t taken_ = 0;
};

template <class Y>
class TakeNode final : public Node<Y> {
public:
    TakeNode(NodePtr<Y> up, std::int64_t n) : up_(std::move(up)), n_(n) {}
    std::unique_ptr<Stage<Y>> make_stage() const override { return std::make_unique<TakeStage<Y>>(up_->make_stage(), n_); }

private:
    NodePtr<Y> up_;
    std::int64_t n_;
};

// ---- prefetch: a producer thread fills up to k slots ahead of the consumer ----

template <class Y>
class PrefetchStage final : public Stage<Y> {
public:
    PrefetchStage(std::unique_ptr<Stage<Y>> up, std::size_t k, std::size_t es, std::size_t yp, std::size_t wp)
        : up_(std::move(up)), es_(es), yp_(yp), wp_(wp), slots_(k + 1), ring_(k + 1) {
        free_.reserve(k + 1);
    }

    ~PrefetchStage() override { stop(); }

    void start(std::uint64_t key) override {
        stop();
        free_.clear();
        for (std::size_t i = 0; i < slots_.size(); ++i) free_.push_back(i);
        head_ = ready_ = 0;
        held_ = none;
        stop_ = done_ = false;
        error_ = nullptr;
        thread_ = std::thread([this, key] { produce(key); });
    }

    bool next(ElementRef<Y>& out) override {
        std::unique_lock<std::mutex> lock(m_);
        if (held_ != none) {
            free_.push_back(held_);
            held_ = none;
            can_produce_.notify_one();
        }
        can_consume_.wait(lock, [this] { return ready_ > 0 || done_; });
        if (ready_ > 0) {
            held_ = ring_[head_];
            head_ = (head_ + 1) % ring_.size();
            --ready_;
            const Slot& s = slots_[held_];
            out = {s.xs.data(), s.ys.data(), s.ws.data(), s.count, false};
            return true;
        }
        if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
        return false;
    }

private:
    struct Slot {
        std::vector<float> xs;
        std::vector<Y> ys;
        std::vector<float> ws;
        std::size_t count = 0;
    };
    static constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

    std::unique_ptr<Stage<Y>> up_;  // touched only by the producer thread while it runs
    std::size_t es_, yp_, wp_;
    std::vector<Slot> slots_;
    std::vector<std::size_t> ring_;  // FIFO of filled slots: ready_ entries from head_
    std::vector<std::size_t> free_;
    std::size_t head_ = 0, ready_ = 0, held_ = none;
    bool stop_ = false, done_ = false;
    std::exception_ptr error_;
    std::mutex m_;
    std::condition_variable can_produce_, can_consume_;
    std::thread thread_;

    void produce(std::uint64_t key) noexcept {
        try {
            up_->start(key);
            for (;;) {
                std::size_t s;
                {
                    std::unique_lock<std::mutex> lock(m_);
                    can_produce_.wait(lock, [this] { return stop_ || !free_.empty(); });
                    if (stop_) return;
                    // Oldest free slot first: slots are used round-robin, so every slot has
                    // grown to a batch within the first k + 1 batches and none allocates later.
                    s = free_.front();
                    free_.erase(free_.begin());
                }
                ElementRef<Y> e;
                if (!up_->next(e)) {
                    std::lock_guard<std::mutex> lock(m_);
                    free_.push_back(s);
                    done_ = true;
                    can_consume_.notify_one();
                    return;
                }
                Slot& slot = slots_[s];
                slot.xs.assign(e.x, e.x + e.count * es_);
                slot.ys.assign(e.y, e.y + e.count * yp_);
                slot.ws.assign(e.w, e.w + e.count * wp_);
                slot.count = e.count;
                {
                    std::lock_guard<std::mutex> lock(m_);
                    ring_[(head_ + ready_) % ring_.size()] = s;
                    ++ready_;
                }
                can_consume_.notify_one();
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(m_);
            error_ = std::current_exception();
            done_ = true;
            can_consume_.notify_one();
        }
    }

    void stop() noexcept {
        if (!thread_.joinable()) return;
        {
            std::lock_guard<std::mutex> lock(m_);
            stop_ = true;
        }
        can_produce_.notify_all();
        thread_.join();
    }
};

template <class Y>
class PrefetchNode final : public Node<Y> {
public:
    PrefetchNode(NodePtr<Y> up, std::size_t k, std::size_t es, std::size_t yp, std::size_t wp)
        : up_(std::move(up)), k_(k), es_(es), yp_(yp), wp_(wp) {}
    std::unique_ptr<Stage<Y>> make_stage() const override {
        return std::make_unique<PrefetchStage<Y>>(up_->make_stage(), k_, es_, yp_, wp_);
    }

private:
    NodePtr<Y> up_;
    std::size_t k_, es_, yp_, wp_;
};

// a * b for cardinalities >= 0, or unknown_cardinality on overflow.
inline std::int64_t mul_cardinality(std::int64_t a, std::int64_t b) noexcept {
    if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a) return unknown_cardinality;
    return a * b;
}

}  // namespace detail::ds

// Dataset's steps are defined out of the class, so that the compiled part's Dataset<int32_t>
// is the only instantiation of them a program with the compiled part compiles (GCC instantiates
// members defined in the class for inlining even where an `extern template` declares them).
template <DatasetLabel Y>
Dataset<Y> Dataset<Y>::from_arrays(std::vector<float> x, std::vector<std::size_t> example_shape, std::vector<Y> y,
                                   std::size_t y_per_example, std::vector<float> sample_weight) {
    using io::shape_text;
    std::size_t es = 1;
    for (auto d : example_shape) es *= d;
    STRATA_CHECK(es > 0, ShapeError, "from_arrays: example shape ", shape_text(example_shape),
                 " has no elements; expected every extent >= 1");
    STRATA_CHECK(y_per_example > 0, ValueError, "from_arrays: y_per_example must be >= 1, got 0");
    STRATA_CHECK(x.size() % es == 0, ShapeError, "from_arrays: x holds ", x.size(),
                 " floats, which is not a whole number of examples of shape ", shape_text(example_shape), " (", es,
                 " floats each)");
    const std::size_t n = x.size() / es;
    STRATA_CHECK(y.size() == n * y_per_example, ShapeError, "from_arrays: x holds ", n, " examples of shape ",
                 shape_text(example_shape), ", so y must hold ", n * y_per_example, " labels (", y_per_example,
                 " per example), but it holds ", y.size());
    const std::size_t wp = sample_weight.empty() ? 0 : 1;
    STRATA_CHECK(sample_weight.empty() || sample_weight.size() == n, ShapeError, "from_arrays: x holds ", n,
                 " examples of shape ", shape_text(example_shape), ", so sample_weight must hold ", n,
                 " weights (one per example) or none, but it holds ", sample_weight.size());
    for (std::size_t i = 0; i < sample_weight.size(); ++i) {
        const float v = sample_weight[i];
        // Keras accepts any weight; a negative one would reward the loss it should penalise,
        // and a NaN or infinity would poison every gradient it touches: refused here, where
        // the index can still be named.
        if (!(std::isfinite(v) && v >= 0.0f))
            throw_error<ValueError>("from_arrays: sample_weight[", i, "] is ", v,
                                    "; sample weights must be finite and >= 0");
    }
    auto arrays = std::make_shared<const detail::ds::Arrays<Y>>(
        detail::ds::Arrays<Y>{std::move(x), std::move(y), std::move(sample_weight), n, es, y_per_example, wp});
    Dataset d;
    d.node_ = std::make_shared<detail::ds::SourceNode<Y>>(std::move(arrays));
    d.shape_ = std::make_shared<const std::vector<std::size_t>>(std::move(example_shape));
    d.es_ = es;
    d.yp_ = y_per_example;
    d.wp_ = wp;
    d.cardinality_ = static_cast<std::int64_t>(n);
    return d;
}

template <DatasetLabel Y>
Dataset<Y> Dataset<Y>::from_arrays(std::vector<float> x, std::vector<std::size_t> example_shape, std::vector<Y> y,
                                   std::vector<float> sample_weight) {
    return from_arrays(std::move(x), std::move(example_shape), std::move(y), 1, std::move(sample_weight));
}

template <DatasetLabel Y>
Dataset<Y> Dataset<Y>::shuffle(std::size_t buffer_size, std::uint64_t seed) const {
    STRATA_CHECK(buffer_size >= 1, ValueError, "shuffle: buffer_size must be >= 1, got 0");
    return with(std::make_shared<detail::ds::ShuffleNode<Y>>(node_, buffer_size, seed, es_, yp_, wp_), cardinality_);
}

template <DatasetLabel Y>
Dataset<Y> Dataset<Y>::batch(std::size_t n, bool drop_remainder) const {
    STRATA_CHECK(n >= 1, ValueError, "batch: the batch size must be >= 1, got 0");
    STRATA_CHECK(batch_ == 0, ValueError, "batch(", n, "): this dataset is already batched (batch size ", batch_,
                 "); call batch once, after the per-example steps");
    std::int64_t c = cardinality_;
    if (c >= 0) {
        const auto b = static_cast<std::int64_t>(n);
        c = drop_remainder ? c / b : c / b + (c % b != 0);
    }
    Dataset d = with(std::make_shared<detail::ds::BatchNode<Y>>(node_, n, drop_remainder, es_, yp_, wp_), c);
    d.batch_ = n;
    return d;
}

template <DatasetLabel Y>
Dataset<Y> Dataset<Y>::repeat(std::int64_t count) const {
    STRATA_CHECK(count >= -1, ValueError, "repeat: count must be >= 0, or -1 for forever; got ", count);
    std::int64_t c = cardinality_;
    if (c == 0 || c == unknown_cardinality) {
    } else if (count == -1) {
        c = infinite_cardinality;
    } else if (count == 0) {
        c = 0;
    } else if (c != infinite_cardinality) {
        c = detail::ds::mul_cardinality(c, count);
    }
    return with(std::make_shared<detail::ds::RepeatNode<Y>>(node_, count), c);
}

template <DatasetLabel Y>
Dataset<Y> Dataset<Y>::augment(const Augment& a) const {
    using io::shape_text;
    const auto& shape = *shape_;
    STRATA_CHECK(shape.size() == 3, ShapeError, "augment: expected images, examples of shape {H, W, C} (rank 3, "
                 "channels last), found example shape ", shape_text(shape), " (rank ", shape.size(), ")");
    const std::size_t h = shape[0], w = shape[1], c = shape[2];
    STRATA_CHECK(a.pad >= 0, ValueError, "augment: expected pad >= 0, found pad ", a.pad);
    STRATA_CHECK(static_cast<std::size_t>(a.pad) < std::min(h, w), ValueError, "augment: expected pad < ",
                 std::min(h, w), " (smaller than the image's height and width), found pad ", a.pad, " for images of ",
                 h, "x", w, " (example shape ", shape_text(shape), ")");
    Dataset d = with(std::make_shared<detail::ds::AugmentNode<Y>>(node_, a, h, w, c), cardinality_);
    d.augmented_ = true;
    return d;
}

template <DatasetLabel Y>
Dataset<Y> Dataset<Y>::cache() const {
    // Reserve for the whole first pass when its size is known and modest (<= 1 GiB of x), so
    // filling the cache does not copy it over and over while growing.
    std::size_t reserve = 0;
    const std::size_t per = batch_ ? batch_ : 1;
    if (cardinality_ >= 0 && static_cast<std::uint64_t>(cardinality_) <= (std::uint64_t(1) << 28) / (per * es_))
        reserve = static_cast<std::size_t>(cardinality_) * per;
    return with(std::make_shared<detail::ds::CacheNode<Y>>(node_, es_, yp_, wp_, reserve), cardinality_);
}

template <DatasetLabel Y>
Dataset<Y> Dataset<Y>::prefetch(std::size_t k) const {
    STRATA_CHECK(k >= 1, ValueError, "prefetch: the buffer size must be >= 1, got 0");
    return with(std::make_shared<detail::ds::PrefetchNode<Y>>(node_, k, es_, yp_, wp_), cardinality_);
}

template <DatasetLabel Y>
Dataset<Y> Dataset<Y>::take(std::int64_t n) const {
    STRATA_CHECK(n >= -1, ValueError, "take: count must be >= 0, or -1 for all; got ", n);
    std::int64_t c = cardinality_;
    if (n >= 0) {
        if (c == infinite_cardinality) c = n;
        else if (c >= 0) c = std::min(c, n);
    }
    return with(std::make_shared<detail::ds::TakeNode<Y>>(node_, n), c);
}

/// An iterator over one pass of a Dataset (a C++20 input iterator; compare with
/// std::default_sentinel for the end). Move-only; it owns the pass's buffers and threads, and
/// its destructor stops them.
///
/// \code
///   for (auto it = ds.iterate(3); it != std::default_sentinel; ++it) use(it->x, it->y);
/// \endcode
template <DatasetLabel Y>
class Dataset<Y>::Iterator {
public:
    using value_type = Batch<Y>;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    Iterator(Iterator&&) noexcept = default;
    Iterator& operator=(Iterator&&) noexcept = default;

    /// The current element. Requires: not at the end.
    const Batch<Y>& operator*() const noexcept { return batch_; }
    const Batch<Y>* operator->() const noexcept { return &batch_; }
    /// Advances to the next element; rethrows what a step threw (on this or a prefetch thread).
    Iterator& operator++() {
        advance();
        return *this;
    }
    void operator++(int) { advance(); }
    /// True at the end of the pass.
    friend bool operator==(const Iterator& it, std::default_sentinel_t) noexcept { return it.done_; }
    /// The epoch this pass belongs to.
    std::uint64_t epoch() const noexcept { return epoch_; }

private:
    friend class Dataset<Y>;

    std::shared_ptr<const std::vector<std::size_t>> shape_;
    std::unique_ptr<detail::ds::Stage<Y>> stage_;
    std::size_t es_ = 0, yp_ = 0, wp_ = 0;
    std::uint64_t epoch_ = 0;
    Batch<Y> batch_{};
    bool done_ = true;

    Iterator(const Dataset& d, std::uint64_t epoch)
        : shape_(d.shape_), stage_(d.node_->make_stage()), es_(d.es_), yp_(d.yp_), wp_(d.wp_), epoch_(epoch) {
        batch_.shape_ = std::span<const std::size_t>(*shape_);
        stage_->start(epoch);
        done_ = false;
        advance();
    }

    void advance() {
        if (done_) return;
        detail::ds::ElementRef<Y> e;
        bool more = false;
        try {
            more = stage_->next(e);
        } catch (...) {
            done_ = true;
            throw;
        }
        if (!more) {
            done_ = true;
            batch_.x = {};
            batch_.y = {};
            batch_.w = {};
            batch_.count_ = 0;
            return;
        }
        batch_.x = std::span<const float>(e.x, e.count * es_);
        batch_.y = std::span<const Y>(e.y, e.count * yp_);
        batch_.w = std::span<const float>(e.w, e.count * wp_);
        batch_.count_ = e.count;
    }
};

/// Dataset<Y>::from_arrays with Y deduced from the label vector:
/// `auto ds = strata::data::from_arrays(std::move(x), {28, 28, 1}, std::move(labels));`
/// `sample_weight`, when not empty, gives each example its weight (see Dataset::from_arrays).
template <DatasetLabel Y>
Dataset<Y> from_arrays(std::vector<float> x, std::vector<std::size_t> example_shape, std::vector<Y> y,
                       std::size_t y_per_example = 1, std::vector<float> sample_weight = {}) {
    return Dataset<Y>::from_arrays(std::move(x), std::move(example_shape), std::move(y), y_per_example,
                                   std::move(sample_weight));
}

/// from_arrays with one label per example, each example weighted:
/// `auto ds = strata::data::from_arrays(std::move(x), {4}, std::move(labels), std::move(weights));`
template <DatasetLabel Y>
Dataset<Y> from_arrays(std::vector<float> x, std::vector<std::size_t> example_shape, std::vector<Y> y,
                       std::vector<float> sample_weight) {
    return Dataset<Y>::from_arrays(std::move(x), std::move(example_shape), std::move(y), 1, std::move(sample_weight));
}

#if STRATA_INSTANCES
// The pipeline of class-id labels (Dataset<>), compiled once in the compiled part.
STRATA_TEMPLATE class Dataset<std::int32_t>;
STRATA_TEMPLATE class detail::ds::SourceStage<std::int32_t>;
STRATA_TEMPLATE class detail::ds::SourceNode<std::int32_t>;
STRATA_TEMPLATE class detail::ds::ShuffleStage<std::int32_t>;
STRATA_TEMPLATE class detail::ds::ShuffleNode<std::int32_t>;
STRATA_TEMPLATE class detail::ds::BatchStage<std::int32_t>;
STRATA_TEMPLATE class detail::ds::BatchNode<std::int32_t>;
STRATA_TEMPLATE class detail::ds::RepeatStage<std::int32_t>;
STRATA_TEMPLATE class detail::ds::RepeatNode<std::int32_t>;
STRATA_TEMPLATE class detail::ds::MapStage<std::int32_t>;
STRATA_TEMPLATE class detail::ds::MapNode<std::int32_t>;
STRATA_TEMPLATE class detail::ds::AugmentStage<std::int32_t>;
STRATA_TEMPLATE class detail::ds::AugmentNode<std::int32_t>;
STRATA_TEMPLATE class detail::ds::CacheStage<std::int32_t>;
STRATA_TEMPLATE class detail::ds::CacheNode<std::int32_t>;
STRATA_TEMPLATE class detail::ds::TakeStage<std::int32_t>;
STRATA_TEMPLATE class detail::ds::TakeNode<std::int32_t>;
STRATA_TEMPLATE class detail::ds::PrefetchStage<std::int32_t>;
STRATA_TEMPLATE class detail::ds::PrefetchNode<std::int32_t>;
#endif

}  // namespace strata::data
