// Tests of strata/data/dataset.hpp: every pipeline step, determinism, prefetch threads, the
// absence of per-batch allocations, and the speed of an MNIST-sized epoch; augment's crops and
// flips (strata/data/augment.hpp) against a plain reference, their determinism, and their
// independence of batching and of the split among replicas.
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "strata/data/dataset.hpp"
#include "strata/distribute/distributed_dataset.hpp"

using namespace strata::data;
using strata_test::error_of;
using strata_test::has;

// Counts heap allocations while `g_count_allocations` is set (from any thread), to check that
// iteration does not allocate per batch in the steady state. (GCC cannot see that these
// replacements pair malloc with free consistently, hence the pragma.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
namespace {
std::atomic<bool> g_count_allocations{false};
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
    if (g_count_allocations.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

// n examples of `es` floats; example i holds i, i + 0.25, ... so its index is x[0]; label i % 10.
Dataset<> numbered(std::size_t n, std::size_t es = 3) {
    std::vector<float> x(n * es);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < es; ++j) x[i * es + j] = static_cast<float>(i) + 0.25f * static_cast<float>(j);
        y[i] = static_cast<std::int32_t>(i % 10);
    }
    return from_arrays(std::move(x), {es}, std::move(y));
}

// The example indices of one pass, in order, checking that each example's x and y agree.
template <class D>
std::vector<int> indices(const D& ds, std::uint64_t epoch) {
    std::vector<int> out;
    for (auto it = ds.iterate(epoch); it != std::default_sentinel; ++it)
        for (std::size_t i = 0; i < it->size(); ++i) {
            const auto x = it->x_at(i);
            const int idx = static_cast<int>(x[0]);
            for (std::size_t j = 1; j < x.size(); ++j) REQUIRE(x[j] == x[0] + 0.25f * static_cast<float>(j));
            REQUIRE(it->y_at(i)[0] == idx % 10);
            out.push_back(idx);
        }
    return out;
}

template <class D>
std::vector<std::size_t> batch_sizes(const D& ds, std::uint64_t epoch = 0) {
    std::vector<std::size_t> v;
    for (auto it = ds.iterate(epoch); it != std::default_sentinel; ++it) v.push_back(it->size());
    return v;
}

std::vector<int> iota(int n, int from = 0) {
    std::vector<int> v(static_cast<std::size_t>(n));
    std::iota(v.begin(), v.end(), from);
    return v;
}

bool is_permutation_of_iota(std::vector<int> v, int n) {
    std::sort(v.begin(), v.end());
    return v == iota(n);
}

// Example i's sample weight in weighted(): unique, exact in float, and unlike any x or y value.
float weight_of(int i) { return 0.5f + static_cast<float>(i); }

// numbered(n, es) with a sample weight per example (weight_of(i)).
Dataset<> weighted(std::size_t n, std::size_t es = 3) {
    std::vector<float> x(n * es), w(n);
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j = 0; j < es; ++j) x[i * es + j] = static_cast<float>(i) + 0.25f * static_cast<float>(j);
        y[i] = static_cast<std::int32_t>(i % 10);
        w[i] = weight_of(static_cast<int>(i));
    }
    return from_arrays(std::move(x), {es}, std::move(y), std::move(w));
}

// indices(), also checking that every element carries one weight per example and that each
// example's weight is the one it was given.
template <class D>
std::vector<int> weighted_indices(const D& ds, std::uint64_t epoch) {
    std::vector<int> out;
    for (auto it = ds.iterate(epoch); it != std::default_sentinel; ++it) {
        REQUIRE(it->has_sample_weight());
        REQUIRE(it->w.size() == it->size());
        for (std::size_t i = 0; i < it->size(); ++i) {
            const int idx = static_cast<int>(it->x_at(i)[0]);
            REQUIRE(it->y_at(i)[0] == idx % 10);
            REQUIRE(it->w_at(i) == weight_of(idx));
            REQUIRE(it->w[i] == weight_of(idx));
            out.push_back(idx);
        }
    }
    return out;
}


}  // namespace

TEST_CASE("dataset: from_arrays checks the counts") {
    const auto x = error_of<strata::ShapeError>([] { from_arrays(std::vector<float>(10), {28, 28, 1}, std::vector<std::int32_t>{}); });
    CHECK(has(x, "x holds 10 floats, which is not a whole number of examples of shape [28, 28, 1] (784 floats each)"));
    const auto y = error_of<strata::ShapeError>([] { from_arrays(std::vector<float>(12), {3}, std::vector<std::int32_t>(3)); });
    CHECK(has(y, "x holds 4 examples of shape [3], so y must hold 4 labels (1 per example), but it holds 3"));
    const auto y2 = error_of<strata::ShapeError>([] { from_arrays(std::vector<float>(12), {3}, std::vector<float>(4), 2); });
    CHECK(has(y2, "y must hold 8 labels (2 per example)"));
    CHECK_THROWS_AS(from_arrays(std::vector<float>(12), {3, 0}, std::vector<std::int32_t>(4)), strata::ShapeError);
    CHECK_THROWS_AS(from_arrays(std::vector<float>(12), {3}, std::vector<std::int32_t>(4), 0), strata::ValueError);
}

TEST_CASE("dataset: unbatched iteration yields every example in order") {
    const auto ds = numbered(5, 4);
    CHECK(ds.cardinality() == 5);
    CHECK(ds.example_size() == 4);
    CHECK(ds.example_shape() == std::vector<std::size_t>{4});
    CHECK(ds.batch_size() == 0);
    CHECK(indices(ds, 0) == iota(5));
    int n = 0;
    for (const auto& b : ds) {
        CHECK(b.size() == 1);
        CHECK(b.x.size() == 4);
        CHECK(b.y.size() == 1);
        CHECK(b.example_shape().size() == 1);
        ++n;
    }
    CHECK(n == 5);
    // An empty dataset is fine too.
    const auto empty = numbered(0);
    CHECK(empty.cardinality() == 0);
    CHECK(indices(empty, 0).empty());
}

TEST_CASE("dataset: batch sizes, remainder and contents") {
    const auto ds = numbered(10);
    CHECK(batch_sizes(ds.batch(4)) == std::vector<std::size_t>{4, 4, 2});
    CHECK(ds.batch(4).cardinality() == 3);
    CHECK(batch_sizes(ds.batch(4, true)) == std::vector<std::size_t>{4, 4});
    CHECK(ds.batch(4, true).cardinality() == 2);
    CHECK(batch_sizes(ds.batch(5)) == std::vector<std::size_t>{5, 5});
    CHECK(batch_sizes(ds.batch(20)) == std::vector<std::size_t>{10});
    CHECK(batch_sizes(ds.batch(20, true)).empty());
    CHECK(ds.batch(20, true).cardinality() == 0);
    CHECK(indices(ds.batch(3), 0) == iota(10));
    CHECK(ds.batch(3).batch_size() == 3);
    auto it = ds.batch(4).iterate(0);
    CHECK(it->x.size() == 12);
    CHECK(it->y.size() == 4);
    CHECK(it->x[3] == 1.0f);

    CHECK(has(error_of<strata::ValueError>([&] { ds.batch(4).batch(2); }), "already batched (batch size 4)"));
    CHECK_THROWS_AS(ds.batch(0), strata::ValueError);
}

TEST_CASE("dataset: shuffle is a seeded permutation, different every epoch") {
    const int n = 200;
    const auto ds = numbered(n).shuffle(n, 42);
    const auto e0 = indices(ds, 0);
    CHECK(is_permutation_of_iota(e0, n));
    CHECK(e0 != iota(n));
    CHECK(indices(ds, 0) == e0);                       // same epoch, same order
    CHECK(indices(numbered(n).shuffle(n, 42), 0) == e0);  // a rebuilt pipeline too
    const auto e1 = indices(ds, 1);
    CHECK(is_permutation_of_iota(e1, n));
    CHECK(e1 != e0);
    CHECK(indices(numbered(n).shuffle(n, 43), 0) != e0);  // another seed

    // Range-for passes of one object are epochs 0, 1, 2, ...
    std::vector<std::vector<int>> passes;
    for (int p = 0; p < 3; ++p) {
        std::vector<int> v;
        for (const auto& b : ds) v.push_back(static_cast<int>(b.x[0]));
        passes.push_back(v);
    }
    CHECK(passes[0] == e0);
    CHECK(passes[1] == e1);
    CHECK(passes[2] == indices(ds, 2));

    // Buffer of 1: no shuffling at all.
    CHECK(indices(numbered(50).shuffle(1, 7), 3) == iota(50));
}

TEST_CASE("dataset: a small shuffle buffer only mixes nearby elements (tf.data semantics)") {
    const int n = 500;
    const std::size_t buffer = 10;
    for (std::uint64_t epoch = 0; epoch < 5; ++epoch) {
        const auto v = indices(numbered(n).shuffle(buffer, 9), epoch);
        REQUIRE(is_permutation_of_iota(v, n));
        // The k-th output was among the first k + buffer inputs.
        for (std::size_t k = 0; k < v.size(); ++k) CHECK(static_cast<std::size_t>(v[k]) < k + buffer);
    }
}

TEST_CASE("dataset: a full shuffle buffer gives every permutation about equally often") {
    const auto ds = numbered(4, 1).shuffle(4, 2024);
    std::map<std::vector<int>, int> counts;
    const int passes = 24000;
    for (int e = 0; e < passes; ++e) ++counts[indices(ds, static_cast<std::uint64_t>(e))];
    CHECK(counts.size() == 24);
    double chi2 = 0;
    for (const auto& [perm, c] : counts) chi2 += (c - 1000.0) * (c - 1000.0) / 1000.0;
    // 23 degrees of freedom: P(chi2 > 60) < 1e-4.
    CHECK(chi2 < 60);
}

TEST_CASE("dataset: shuffle after batch moves whole batches") {
    const auto v = indices(numbered(20).batch(5).shuffle(4, 1), 0);
    REQUIRE(is_permutation_of_iota(v, 20));
    for (std::size_t b = 0; b < 4; ++b)
        for (std::size_t i = 1; i < 5; ++i) CHECK(v[b * 5 + i] == v[b * 5] + static_cast<int>(i));
}

TEST_CASE("dataset: repeat") {
    const auto ds = numbered(6);
    CHECK(ds.repeat(3).cardinality() == 18);
    auto v = indices(ds.repeat(3), 0);
    CHECK(v.size() == 18);
    CHECK(std::vector<int>(v.begin() + 6, v.begin() + 12) == iota(6));
    CHECK(indices(ds.repeat(0), 0).empty());
    CHECK(ds.repeat(0).cardinality() == 0);
    CHECK(ds.repeat().cardinality() == infinite_cardinality);
    CHECK(ds.repeat().take(20).cardinality() == 20);
    CHECK(indices(ds.repeat().take(20), 0).size() == 20);
    CHECK(ds.batch(4).repeat(2).cardinality() == 4);
    CHECK(batch_sizes(ds.batch(4).repeat(2)) == std::vector<std::size_t>{4, 2, 4, 2});
    CHECK(batch_sizes(ds.repeat(2).batch(4)) == std::vector<std::size_t>{4, 4, 4});
    CHECK_THROWS_AS(ds.repeat(-2), strata::ValueError);

    // Each repetition of a shuffle is reshuffled, deterministically.
    const auto sr = ds.shuffle(6, 5).repeat(4);
    const auto a = indices(sr, 0);
    REQUIRE(a.size() == 24);
    std::set<std::vector<int>> blocks;
    for (int r = 0; r < 4; ++r) {
        std::vector<int> block(a.begin() + 6 * r, a.begin() + 6 * (r + 1));
        CHECK(is_permutation_of_iota(block, 6));
        blocks.insert(block);
    }
    CHECK(blocks.size() > 1);
    CHECK(indices(sr, 0) == a);
    CHECK(indices(sr, 1) != a);

    // Repeating an empty dataset forever ends at once instead of spinning.
    const auto empty = numbered(0).repeat();
    CHECK(empty.cardinality() == 0);
    CHECK(indices(empty, 0).empty());
}

TEST_CASE("dataset: map edits a copy of each element") {
    const auto ds = numbered(8);
    const auto doubled = ds.map([](std::span<float> x, std::span<std::int32_t> y) {
        for (auto& v : x) v *= 2;
        y[0] += 100;
    });
    std::vector<float> firsts;
    std::vector<std::int32_t> labels;
    for (const auto& b : doubled) {
        firsts.push_back(b.x[0]);
        labels.push_back(b.y[0]);
    }
    CHECK(firsts == std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14});
    CHECK(labels == std::vector<std::int32_t>{100, 101, 102, 103, 104, 105, 106, 107});
    CHECK(indices(ds, 0) == iota(8));  // the source is untouched

    // After batch, map sees whole batches.
    std::vector<std::size_t> seen;
    const auto per_batch = ds.batch(3).map([&](std::span<float> x, std::span<std::int32_t> y) {
        seen.push_back(y.size());
        CHECK(x.size() == 3 * y.size());
    });
    CHECK(per_batch.cardinality() == 3);
    for (const auto& b : per_batch) (void)b;
    CHECK(seen == std::vector<std::size_t>{3, 3, 2});

    // An exception from map reaches the loop.
    const auto throwing = ds.map([](std::span<float> x, std::span<std::int32_t>) {
        if (x[0] == 3) throw std::runtime_error("bad example 3");
    });
    int reached = 0;
    CHECK_THROWS_WITH_AS(
        [&] {
            for (const auto& b : throwing) {
                (void)b;
                ++reached;
            }
        }(),
        "bad example 3", std::runtime_error);
    CHECK(reached == 3);
}

TEST_CASE("dataset: regression targets (float labels, several per example)") {
    std::vector<float> x{0, 1, 2, 3, 4, 5};
    std::vector<float> y{0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f};
    const auto ds = from_arrays(std::move(x), {2}, std::move(y), 2).batch(2);
    static_assert(std::is_same_v<decltype(ds), const Dataset<float>>);
    auto it = ds.iterate(0);
    CHECK(it->y_per_example() == 2);
    CHECK(it->y.size() == 4);
    CHECK(it->y_at(1)[1] == -1.5f);
    ++it;
    CHECK(it->size() == 1);
    CHECK(it->y_at(0)[0] == 2.5f);
    ++it;
    CHECK(it == std::default_sentinel);
}

TEST_CASE("dataset: cache runs the steps before it once") {
    std::atomic<int> calls{0};
    const auto ds = numbered(10).map([&](std::span<float>, std::span<std::int32_t>) { ++calls; }).cache();
    CHECK(indices(ds, 0) == iota(10));
    CHECK(calls == 10);
    CHECK(indices(ds, 1) == iota(10));
    CHECK(indices(ds, 7) == iota(10));
    CHECK(calls == 10);

    // Copies share the cache; steps after it still run every pass (and reshuffle).
    const auto shuffled = ds.shuffle(10, 3).batch(4);
    CHECK(is_permutation_of_iota(indices(shuffled, 0), 10));
    CHECK(indices(shuffled, 0) != indices(shuffled, 1));
    CHECK(calls == 10);

    // A pass that stops early caches nothing.
    std::atomic<int> calls2{0};
    const auto partial = numbered(10).map([&](std::span<float>, std::span<std::int32_t>) { ++calls2; }).cache();
    CHECK(indices(partial.take(3), 0) == iota(3));
    CHECK(calls2 == 3);
    CHECK(indices(partial, 0) == iota(10));
    CHECK(calls2 == 13);
    CHECK(indices(partial, 0) == iota(10));
    CHECK(calls2 == 13);

    // Cached batches keep their sizes.
    const auto cb = numbered(10).batch(4).cache();
    CHECK(batch_sizes(cb) == std::vector<std::size_t>{4, 4, 2});
    CHECK(batch_sizes(cb) == std::vector<std::size_t>{4, 4, 2});
    CHECK(indices(cb, 1) == iota(10));

    // cache().repeat() replays from the second repetition on.
    std::atomic<int> calls3{0};
    const auto cr = numbered(5).map([&](std::span<float>, std::span<std::int32_t>) { ++calls3; }).cache().repeat(3);
    CHECK(indices(cr, 0).size() == 15);
    CHECK(calls3 == 5);
}

TEST_CASE("dataset: prefetch yields the same sequence") {
    const auto base = numbered(1000, 5).shuffle(300, 11).map([](std::span<float>, std::span<std::int32_t>) {}).batch(32);
    for (std::size_t k : {1u, 2u, 7u, 100u}) {
        const auto pre = base.prefetch(k);
        CHECK(pre.cardinality() == base.cardinality());
        for (std::uint64_t e = 0; e < 3; ++e) CHECK(indices(pre, e) == indices(base, e));
        CHECK(batch_sizes(pre) == batch_sizes(base));
    }
    // Prefetch in the middle, nested, and under repeat.
    const auto nested = numbered(100).prefetch(3).shuffle(50, 1).batch(8).prefetch(2).repeat(3).prefetch(1);
    const auto plain = numbered(100).shuffle(50, 1).batch(8).repeat(3);
    CHECK(indices(nested, 4) == indices(plain, 4));
}

TEST_CASE("dataset: prefetch passes the producer's exception on, after the elements before it") {
    const auto ds = numbered(20)
                        .map([](std::span<float> x, std::span<std::int32_t>) {
                            if (x[0] == 13) throw std::invalid_argument("example 13 is corrupt");
                        })
                        .prefetch(4);
    std::vector<int> got;
    try {
        for (const auto& b : ds) got.push_back(static_cast<int>(b.x[0]));
        FAIL("no exception");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()) == "example 13 is corrupt");
    }
    CHECK(got == iota(13));

    // strata errors keep their type across the thread too.
    const auto bad = numbered(5).map([](std::span<float>, std::span<std::int32_t>) {
                                     strata::throw_error<strata::ValueError>("bad value");
                                 })
                         .batch(2)
                         .prefetch(2);
    CHECK_THROWS_AS(bad.iterate(0), strata::ValueError);
}

TEST_CASE("dataset: destroying a prefetching iterator mid-epoch stops its thread") {
    const auto slow = numbered(1000)
                          .map([](std::span<float>, std::span<std::int32_t>) {
                              std::this_thread::sleep_for(std::chrono::microseconds(200));
                          })
                          .prefetch(8);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) {
        auto it = slow.iterate(static_cast<std::uint64_t>(i));
        CHECK(it->size() == 1);
        ++it;
    }  // each iterator is destroyed with its producer mid-epoch
    {
        auto forever = numbered(10).repeat().prefetch(3).iterate(0);
        for (int i = 0; i < 25; ++i) ++forever;
        CHECK(forever != std::default_sentinel);
    }  // producer blocked on a full queue of an infinite dataset
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(seconds < 5.0);
}

TEST_CASE("dataset: take and cardinality") {
    const auto ds = numbered(10);
    CHECK(ds.take(3).cardinality() == 3);
    CHECK(indices(ds.take(3), 0) == iota(3));
    CHECK(ds.take(20).cardinality() == 10);
    CHECK(indices(ds.take(20), 0) == iota(10));
    CHECK(ds.take(-1).cardinality() == 10);
    CHECK(ds.take(0).cardinality() == 0);
    CHECK(indices(ds.take(0), 0).empty());
    CHECK(ds.batch(3).take(2).cardinality() == 2);
    CHECK(batch_sizes(ds.batch(3).take(2)) == std::vector<std::size_t>{3, 3});
    CHECK(ds.shuffle(4, 1).map([](std::span<float>, std::span<std::int32_t>) {}).cache().prefetch().cardinality() == 10);
    CHECK(ds.repeat().batch(4).cardinality() == infinite_cardinality);
    CHECK(ds.repeat().take(7).batch(2).cardinality() == 4);
    CHECK_THROWS_AS(ds.take(-2), strata::ValueError);
    CHECK(unknown_cardinality == -2);
}

TEST_CASE("dataset: several threads iterate one dataset at once") {
    const auto ds = numbered(2000).cache().shuffle(2000, 8).batch(50).prefetch(2);
    const auto expected = indices(ds, 5);
    std::vector<std::vector<int>> results(4);
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < results.size(); ++t)
        threads.emplace_back([&, t] {
            for (auto it = ds.iterate(5); it != std::default_sentinel; ++it)
                for (std::size_t i = 0; i < it->size(); ++i) results[t].push_back(static_cast<int>(it->x_at(i)[0]));
        });
    for (auto& th : threads) th.join();
    for (const auto& r : results) CHECK(r == expected);
}

TEST_CASE("dataset: no allocation per batch in the steady state") {
    // map before shuffle makes the shuffle buffer hold copies; prefetch adds a thread.
    const auto ds = numbered(3000, 16)
                        .map([](std::span<float> x, std::span<std::int32_t>) { x[1] += 0; })
                        .shuffle(200, 1)
                        .batch(32)
                        .prefetch(3);
    auto it = ds.iterate(0);
    for (int i = 0; i < 10; ++i) ++it;  // fills the shuffle buffer and every prefetch slot once
    g_allocations = 0;
    std::size_t batches = 0;
    double sum = 0;
    std::vector<long> at_batch;
    at_batch.reserve(200);
    g_count_allocations = true;
    for (; it != std::default_sentinel; ++it) {
        sum += it->x[0];
        ++batches;
        at_batch.push_back(g_allocations.load());
    }
    g_count_allocations = false;
    // The last few batches are the pass winding down (the producer thread finishing): not the
    // steady state this checks.
    REQUIRE(at_batch.size() > 8);
    g_allocations = at_batch[at_batch.size() - 5];
    CHECK(batches == 94 - 10);
    CHECK(sum > 0);
    CHECK(g_allocations == 0);
}


// ---- sample weights ------------------------------------------------------------------------

TEST_CASE("dataset: sample weights, unweighted datasets and from_arrays' checks") {
    const auto plain = numbered(6);
    CHECK(!plain.has_sample_weight());
    CHECK(!plain.batch(4).shuffle(2, 1).has_sample_weight());
    for (const auto& b : plain.batch(4)) {
        CHECK(!b.has_sample_weight());
        CHECK(b.w.empty());
        CHECK(b.w_at(0) == 1.0f);   // an example without a weight counts fully
    }
    const auto ds = weighted(6);
    CHECK(ds.has_sample_weight());
    CHECK(ds.cardinality() == 6);
    CHECK(weighted_indices(ds, 0) == iota(6));
    // Every step keeps the flag.
    CHECK(ds.shuffle(3, 1).map([](std::span<float>, std::span<std::int32_t>) {}).cache().batch(2).prefetch().take(2)
              .repeat(2).has_sample_weight());

    // Several labels per example, and the class method with y_per_example spelled out.
    const auto reg = Dataset<float>::from_arrays({0, 1, 2, 3, 4, 5}, {2}, {10, 11, 20, 21, 30, 31}, 2, {0.25f, 0.0f, 4.0f});
    CHECK(reg.has_sample_weight());
    auto it = reg.batch(2).iterate(0);
    CHECK(it->w.size() == 2);
    CHECK(it->w_at(1) == 0.0f);
    CHECK(it->y_at(1)[1] == 21.0f);
    ++it;
    CHECK(it->w_at(0) == 4.0f);
    CHECK(it->y_at(0)[0] == 30.0f);
    // An empty weight vector is no weights.
    CHECK(!from_arrays(std::vector<float>(6), {3}, std::vector<std::int32_t>(2), std::vector<float>{}).has_sample_weight());

    const auto count = error_of<strata::ShapeError>(
        [] { from_arrays(std::vector<float>(12), {3}, std::vector<std::int32_t>(4), std::vector<float>(3, 1.0f)); });
    CHECK(has(count, "x holds 4 examples of shape [3], so sample_weight must hold 4 weights (one per example) or none, "
                     "but it holds 3"));
    const auto count2 = error_of<strata::ShapeError>(
        [] { from_arrays(std::vector<float>(12), {3}, std::vector<float>(8), 2, std::vector<float>(5, 1.0f)); });
    CHECK(has(count2, "sample_weight must hold 4 weights"));
    CHECK(has(count2, "it holds 5"));
    const auto negative = error_of<strata::ValueError>(
        [] { from_arrays(std::vector<float>(12), {3}, std::vector<std::int32_t>(4), std::vector<float>{1, 2, -0.5f, 1}); });
    CHECK(has(negative, "from_arrays: sample_weight[2] is -0.5; sample weights must be finite and >= 0"));
    const auto nan = error_of<strata::ValueError>([] {
        from_arrays(std::vector<float>(12), {3}, std::vector<std::int32_t>(4),
                    std::vector<float>{1, std::numeric_limits<float>::quiet_NaN(), 1, 1});
    });
    CHECK(has(nan, "sample_weight[1] is nan"));
    const auto inf = error_of<strata::ValueError>([] {
        from_arrays(std::vector<float>(12), {3}, std::vector<std::int32_t>(4),
                    std::vector<float>{1, 1, 1, std::numeric_limits<float>::infinity()});
    });
    CHECK(has(inf, "sample_weight[3] is inf"));
}

TEST_CASE("dataset: batch carries weights on the view path, the copy path, and the switch between them") {
    const auto ds = weighted(10);
    // Unshuffled examples of the array are batched as views: consecutive batches' weights lie
    // side by side in the dataset's own array.
    {
        auto it = ds.batch(4).iterate(0);
        const float* first = it->w.data();
        CHECK(it->w_at(3) == weight_of(3));
        ++it;
        CHECK(it->w.data() == first + 4);
        CHECK(it->w_at(0) == weight_of(4));
    }
    CHECK(weighted_indices(ds.batch(4), 0) == iota(10));
    CHECK(weighted_indices(ds.batch(4, true), 0) == iota(8));
    // Shuffled examples are copied into the batch buffer (the same buffer for every batch).
    {
        const auto sb = ds.shuffle(10, 5).batch(4);
        auto it = sb.iterate(0);
        const float* first = it->w.data();
        ++it;
        CHECK(it->w.data() == first);
        CHECK(is_permutation_of_iota(weighted_indices(sb, 0), 10));
    }
    // Under repeat the third batch starts as a view (examples 8, 9) and turns into a copy when
    // example 0 comes round again: its first weights are copied out of the view then.
    const auto rb = ds.repeat(2).batch(4);
    CHECK(batch_sizes(rb) == std::vector<std::size_t>{4, 4, 4, 4, 4});
    std::vector<int> expected = iota(10);
    const auto again = iota(10);
    expected.insert(expected.end(), again.begin(), again.end());
    CHECK(weighted_indices(rb, 0) == expected);
    // A map before batch makes every example a copy.
    CHECK(weighted_indices(ds.map([](std::span<float>, std::span<std::int32_t>) {}).batch(3), 0) == iota(10));
}

TEST_CASE("dataset: every step keeps each example's weight with it (shuffle, map, cache, prefetch, take, repeat)") {
    const int n = 64;
    const auto ds = weighted(n, 2);
    // shuffle holding references to the array's examples, and holding copies (after a map).
    const auto by_ref = ds.shuffle(n, 3);
    const auto by_copy = ds.map([](std::span<float>, std::span<std::int32_t>) {}).shuffle(17, 3);
    for (std::uint64_t e = 0; e < 3; ++e) {
        const auto a = weighted_indices(by_ref, e), b = weighted_indices(by_copy, e);
        CHECK(is_permutation_of_iota(a, n));
        CHECK(is_permutation_of_iota(b, n));
        CHECK(a != iota(n));
        CHECK(b != iota(n));
    }
    // map edits x and y; the weights are neither shown to it nor changed.
    const auto edited = ds.batch(8).map([](std::span<float> x, std::span<std::int32_t> y) {
        for (auto& v : x) v += 0;
        for (auto& v : y) v += 0;
    });
    CHECK(weighted_indices(edited, 0) == iota(n));
    // cache of examples and of batches; shuffle after cache (references into the cache).
    std::atomic<int> calls{0};
    const auto cached = ds.map([&](std::span<float>, std::span<std::int32_t>) { ++calls; }).cache();
    CHECK(weighted_indices(cached, 0) == iota(n));
    CHECK(weighted_indices(cached, 1) == iota(n));
    CHECK(calls == n);
    CHECK(is_permutation_of_iota(weighted_indices(cached.shuffle(n, 9).batch(5), 2), n));
    const auto cached_batches = ds.shuffle(n, 4).batch(6).cache();
    const auto first_pass = weighted_indices(cached_batches, 1);
    CHECK(first_pass == weighted_indices(ds.shuffle(n, 4).batch(6), 1));
    CHECK(weighted_indices(cached_batches, 3) == first_pass);   // replayed from the cache
    // prefetch, take, repeat, and the whole pipeline at once.
    CHECK(weighted_indices(ds.shuffle(20, 2).batch(7).prefetch(3), 4) == weighted_indices(ds.shuffle(20, 2).batch(7), 4));
    CHECK(weighted_indices(ds.take(5), 0) == iota(5));
    CHECK(weighted_indices(ds.batch(10).take(2), 0) == iota(20));
    // Every kind of step, twice over; applied to a weighted and an unweighted source below.
    auto pipeline = [n](const auto& source) {
        return source.map([](std::span<float> x, std::span<std::int32_t>) { x[1] += 0; })
            .cache()
            .shuffle(n, 11)
            .prefetch(2)
            .batch(8)
            .map([](std::span<float>, std::span<std::int32_t>) {})
            .shuffle(3, 12)
            .prefetch(1)
            .take(6)
            .repeat(3);
    };
    const auto all = pipeline(ds);
    const auto seen = weighted_indices(all, 5);
    CHECK(seen.size() == std::size_t(3 * 6 * 8));
    for (std::size_t rep = 0; rep < 3; ++rep) {   // each repetition: 48 different examples
        const std::set<int> distinct(seen.begin() + std::ptrdiff_t(rep * 48), seen.begin() + std::ptrdiff_t(rep * 48 + 48));
        CHECK(distinct.size() == 48);
    }
    // The same pipeline unweighted yields the same examples in the same order: weights change
    // nothing else.
    const auto unweighted = pipeline(numbered(std::size_t(n), 2));
    CHECK(indices(unweighted, 5) == seen);
}

TEST_CASE("dataset: no allocation per batch in the steady state with sample weights either") {
    const auto ds = weighted(3000, 16)
                        .map([](std::span<float> x, std::span<std::int32_t>) { x[1] += 0; })
                        .shuffle(200, 1)
                        .batch(32)
                        .prefetch(3);
    auto it = ds.iterate(0);
    for (int i = 0; i < 10; ++i) ++it;
    std::vector<long> at_batch;
    at_batch.reserve(200);
    double sum = 0;
    g_allocations = 0;
    g_count_allocations = true;
    for (; it != std::default_sentinel; ++it) {
        sum += it->w[0];
        at_batch.push_back(g_allocations.load());
    }
    g_count_allocations = false;
    REQUIRE(at_batch.size() > 8);
    CHECK(sum > 0);
    CHECK(at_batch[at_batch.size() - 5] == 0);
}

// ---- augment: random crop after zero padding, random horizontal flip ------------------------

namespace {

// n images of h x w x c; pixel (r, j, ch) of example i is i * 1000 + r * 100 + j * 10 + ch + 1:
// never 0 (so padding shows), and it names its example and place. Label i, weight 0.5 + i.
Dataset<> images(std::size_t n, std::size_t h, std::size_t w, std::size_t c, bool with_weights = false) {
    std::vector<float> x(n * h * w * c), wts;
    std::vector<std::int32_t> y(n);
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t r = 0; r < h; ++r)
            for (std::size_t j = 0; j < w; ++j)
                for (std::size_t ch = 0; ch < c; ++ch)
                    x[((i * h + r) * w + j) * c + ch] = static_cast<float>(i * 1000 + r * 100 + j * 10 + ch + 1);
        y[i] = static_cast<std::int32_t>(i);
        if (with_weights) wts.push_back(weight_of(static_cast<int>(i)));
    }
    return from_arrays(std::move(x), {h, w, c}, std::move(y), std::move(wts));
}

// The image `in` (h x w x c) padded with zeros, cropped at (dy, dx), then mirrored: the
// definition, written the plain way (a padded copy, then a crop, then a flip).
std::vector<float> reference_augment(std::span<const float> in, std::size_t h, std::size_t w, std::size_t c,
                                     std::size_t pad, AugmentDraw d) {
    const std::size_t ph = h + 2 * pad, pw = w + 2 * pad;
    std::vector<float> padded(ph * pw * c, 0.0f);
    for (std::size_t r = 0; r < h; ++r)
        for (std::size_t j = 0; j < w; ++j)
            for (std::size_t ch = 0; ch < c; ++ch)
                padded[((r + pad) * pw + (j + pad)) * c + ch] = in[(r * w + j) * c + ch];
    std::vector<float> crop(h * w * c);
    for (std::size_t r = 0; r < h; ++r)
        for (std::size_t j = 0; j < w; ++j)
            for (std::size_t ch = 0; ch < c; ++ch)
                crop[(r * w + j) * c + ch] =
                    padded[((r + std::size_t(d.dy)) * pw + (j + std::size_t(d.dx))) * c + ch];
    if (!d.flip) return crop;
    std::vector<float> out(crop.size());
    for (std::size_t r = 0; r < h; ++r)
        for (std::size_t j = 0; j < w; ++j)
            for (std::size_t ch = 0; ch < c; ++ch) out[(r * w + j) * c + ch] = crop[(r * w + (w - 1 - j)) * c + ch];
    return out;
}

// Every example of one pass, in order: its label (the source index), its x, its weight.
struct Seen {
    std::vector<std::int32_t> y;
    std::vector<float> x;
    std::vector<float> w;
};
template <class D>
Seen pass_of(const D& ds, std::uint64_t epoch) {
    Seen s;
    for (auto it = ds.iterate(epoch); it != std::default_sentinel; ++it) {
        s.y.insert(s.y.end(), it->y.begin(), it->y.end());
        s.x.insert(s.x.end(), it->x.begin(), it->x.end());
        s.w.insert(s.w.end(), it->w.begin(), it->w.end());
    }
    return s;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("augment: augment_image against the plain definition, and a known image pixel by pixel") {
    // 2 x 3, one channel: padded by 1 it is
    //   0 0 0 0 0
    //   0 1 2 3 0
    //   0 4 5 6 0
    //   0 0 0 0 0
    const std::vector<float> img{1, 2, 3, 4, 5, 6};
    std::vector<float> out(6);
    const auto crop = [&](int dy, int dx, bool flip) {
        augment_image(img, out, 2, 3, 1, 1, {dy, dx, flip});
        return out;
    };
    CHECK(crop(1, 1, false) == img);  // the centre: the image itself
    CHECK(crop(0, 0, false) == std::vector<float>{0, 0, 0, 0, 1, 2});
    CHECK(crop(0, 0, true) == std::vector<float>{0, 0, 0, 2, 1, 0});
    CHECK(crop(2, 2, false) == std::vector<float>{5, 6, 0, 0, 0, 0});
    CHECK(crop(2, 0, false) == std::vector<float>{0, 4, 5, 0, 0, 0});
    CHECK(crop(1, 2, true) == std::vector<float>{0, 3, 2, 0, 6, 5});
    CHECK(crop(1, 1, true) == std::vector<float>{3, 2, 1, 6, 5, 4});

    // Every offset and both flips of a 3 x 4 x 2 image padded by 2 (dy, dx in [0, 4]), and of a
    // 5 x 3 x 3 one padded by 2: equal to the plain definition, bit for bit.
    for (auto [h, w, c] : {std::array<std::size_t, 3>{3, 4, 2}, std::array<std::size_t, 3>{5, 3, 3}}) {
        std::vector<float> in(h * w * c);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) + 0.5f;
        std::vector<float> o(in.size(), -1.0f);
        for (int dy = 0; dy <= 4; ++dy)
            for (int dx = 0; dx <= 4; ++dx)
                for (bool flip : {false, true}) {
                    augment_image(in, o, h, w, c, 2, {dy, dx, flip});
                    REQUIRE(o == reference_augment(in, h, w, c, 2, {dy, dx, flip}));
                }
    }
}

TEST_CASE("augment: each example gets augment_draw(seed, epoch, its position in the pass)") {
    const Augment a{.pad = 2, .flip = true, .seed = 9};
    const auto ds = images(40, 5, 6, 3).shuffle(40, 7).augment(a).batch(8);
    const auto plain = images(40, 5, 6, 3);
    const auto source = pass_of(plain, 0);
    const std::size_t es = 5 * 6 * 3;
    for (std::uint64_t epoch : {0u, 1u, 17u}) {
        const auto seen = pass_of(ds, epoch);
        REQUIRE(seen.y.size() == 40);
        // The shuffle is untouched: the same order as without augment.
        CHECK(seen.y == pass_of(images(40, 5, 6, 3).shuffle(40, 7).batch(8), epoch).y);
        for (std::size_t p = 0; p < 40; ++p) {
            const auto i = static_cast<std::size_t>(seen.y[p]);
            const std::span<const float> orig(source.x.data() + i * es, es);
            const auto want = reference_augment(orig, 5, 6, 3, 2, augment_draw(a, epoch, p));
            REQUIRE(same_bits(std::span<const float>(seen.x.data() + p * es, es), want));
        }
    }
    // The draws are what augment.hpp documents: a Generator keyed by (seed, pass), stream = position.
    strata::random::Generator g(augment_pass_key(a.seed, 3), 5);
    const bool flip = (g.next_u32() >> 31) != 0;
    const int dy = static_cast<int>(g.below(5)), dx = static_cast<int>(g.below(5));
    CHECK(augment_draw(a, 3, 5) == AugmentDraw{dy, dx, flip});
    // Flips do not depend on the padding, offsets not on whether flips are on.
    for (std::uint64_t p = 0; p < 50; ++p) {
        CHECK(augment_draw({.pad = 0, .flip = true, .seed = 9}, 3, p).flip == augment_draw(a, 3, p).flip);
        const auto no_flip = augment_draw({.pad = 2, .flip = false, .seed = 9}, 3, p);
        CHECK(!no_flip.flip);
        CHECK(no_flip.dy == augment_draw(a, 3, p).dy);
        CHECK(no_flip.dx == augment_draw(a, 3, p).dx);
    }
}

TEST_CASE("augment: deterministic per (seed, epoch); other epochs and seeds give other images") {
    const auto make = [](std::uint64_t seed) {
        return images(64, 6, 6, 2).shuffle(64, 3).augment({.pad = 2, .flip = true, .seed = seed}).batch(16);
    };
    const auto ds = make(1);
    const auto e0 = pass_of(ds, 0);
    CHECK(same_bits(e0.x, pass_of(ds, 0).x));
    CHECK(same_bits(e0.x, pass_of(make(1), 0).x));  // another Dataset object, the same configuration
    CHECK(!same_bits(e0.x, pass_of(ds, 1).x));
    CHECK(!same_bits(e0.x, pass_of(make(2), 0).x));
    // A range-for's passes are epochs 0, 1, ...: its first pass is epoch 0's.
    Seen first;
    for (const auto& b : ds) {
        first.x.insert(first.x.end(), b.x.begin(), b.x.end());
    }
    CHECK(same_bits(first.x, e0.x));
    // Without a shuffle too: the same examples in the same order, augmented differently per epoch.
    const auto unshuffled = images(64, 6, 6, 2).augment({.pad = 2, .flip = true, .seed = 1}).batch(16);
    CHECK(pass_of(unshuffled, 0).y == pass_of(unshuffled, 1).y);
    CHECK(!same_bits(pass_of(unshuffled, 0).x, pass_of(unshuffled, 1).x));
    // Under repeat, every repetition is augmented differently, whichever side of repeat it is on.
    for (const auto& rep : {images(16, 4, 4, 1).augment({.pad = 1, .flip = true, .seed = 4}).repeat(2).batch(16),
                            images(16, 4, 4, 1).repeat(2).augment({.pad = 1, .flip = true, .seed = 4}).batch(16)}) {
        const auto r = pass_of(rep, 0);
        REQUIRE(r.x.size() == 2 * 16 * 16);
        CHECK(!same_bits(std::span<const float>(r.x).first(256), std::span<const float>(r.x).last(256)));
        CHECK(same_bits(r.x, pass_of(rep, 0).x));
    }
}

TEST_CASE("augment: the same images whatever the batching, prefetch, or split among replicas") {
    const Augment a{.pad = 3, .flip = true, .seed = 11};
    const auto base = images(50, 7, 5, 2).shuffle(50, 5);
    const std::size_t es = 7 * 5 * 2;
    // One example at a time, unbatched: what one device would see, example by example.
    const auto one = pass_of(base.augment(a), 2);
    REQUIRE(one.y.size() == 50);
    for (const auto& ds : {base.augment(a).batch(7), base.batch(7).augment(a), base.augment(a).batch(50),
                           base.augment(a).batch(8).prefetch(2), base.augment(a).prefetch(3).batch(16)}) {
        const auto s = pass_of(ds, 2);
        CHECK(s.y == one.y);
        CHECK(same_bits(s.x, one.x));
    }
    // Each replica's share of each global batch holds exactly those examples' images, for any
    // number of replicas (split_batch: contiguous shares [first, first + size)).
    const auto global = base.augment(a).batch(12);
    for (int replicas = 1; replicas <= 5; ++replicas) {
        strata::distribute::DistributedDataset<std::int32_t> dist(global, replicas);
        std::size_t at = 0;  // examples of the pass before this batch
        for (auto it = dist.iterate(2); it != std::default_sentinel; ++it) {
            const auto batch = *it;
            std::int64_t covered = 0;
            for (int r = 0; r < replicas; ++r) {
                const auto share = batch[r];
                REQUIRE(share.first == covered);
                covered += share.size;
                const std::size_t from = at + static_cast<std::size_t>(share.first);
                const std::size_t n = static_cast<std::size_t>(share.size);
                CHECK(same_bits(share.x, std::span<const float>(one.x.data() + from * es, n * es)));
                CHECK(std::equal(share.y.begin(), share.y.end(), one.y.begin() + static_cast<std::ptrdiff_t>(from)));
            }
            CHECK(covered == batch.global_size());
            at += static_cast<std::size_t>(batch.global_size());
        }
        CHECK(at == 50);
    }
}

TEST_CASE("augment: about half the images are flipped, and the crop offsets are uniform") {
    // Through the dataset: pad 0, flip on; an image is either itself or its mirror.
    const std::size_t n = 4000;
    const auto ds = images(n, 3, 4, 1).augment({.pad = 0, .flip = true, .seed = 123}).batch(100);
    const auto plain = pass_of(images(n, 3, 4, 1), 0);
    const auto seen = pass_of(ds, 0);
    std::size_t flipped = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const std::span<const float> x(seen.x.data() + i * 12, 12), orig(plain.x.data() + i * 12, 12);
        if (same_bits(x, orig)) continue;
        REQUIRE(same_bits(x, reference_augment(orig, 3, 4, 1, 0, {0, 0, true})));
        ++flipped;
    }
    // Binomial(4000, 1/2): standard deviation 0.0079 of the fraction; 0.04 is 5 of them.
    CHECK(std::abs(static_cast<double>(flipped) / n - 0.5) < 0.04);

    // The draws themselves, over 45000 examples of two epochs: flips 1/2, each of the 9
    // offsets of pad 4 a ninth of the time in each coordinate, and dy, dx independent.
    const Augment a{.pad = 4, .flip = true, .seed = 5};
    std::array<long, 9> dys{}, dxs{};
    long flips = 0, equal = 0, total = 0;
    for (std::uint64_t epoch : {0u, 1u})
        for (std::uint64_t p = 0; p < 22500; ++p) {
            const auto d = augment_draw(a, epoch, p);
            REQUIRE(d.dy >= 0);
            REQUIRE(d.dy <= 8);
            REQUIRE(d.dx >= 0);
            REQUIRE(d.dx <= 8);
            ++dys[static_cast<std::size_t>(d.dy)];
            ++dxs[static_cast<std::size_t>(d.dx)];
            flips += d.flip;
            equal += d.dy == d.dx;
            ++total;
        }
    CHECK(std::abs(static_cast<double>(flips) / total - 0.5) < 0.02);
    for (std::size_t k = 0; k < 9; ++k) {
        // Expected 5000 each, standard deviation 67: within 10 % (7 of them).
        CHECK(std::abs(dys[k] - 5000) < 500);
        CHECK(std::abs(dxs[k] - 5000) < 500);
    }
    CHECK(std::abs(static_cast<double>(equal) / total - 1.0 / 9) < 0.02);
}

TEST_CASE("augment: pad 0 without flips changes nothing, bit for bit") {
    // Values whose bits an arithmetic round trip could change: -0, a NaN payload, subnormals.
    std::vector<float> x(10 * 2 * 3 * 1);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.1f - 1.0f;
    x[0] = -0.0f;
    x[1] = std::numeric_limits<float>::quiet_NaN();
    x[2] = std::numeric_limits<float>::denorm_min();
    x[3] = -std::numeric_limits<float>::infinity();
    std::vector<std::int32_t> y(10);
    std::iota(y.begin(), y.end(), 0);
    const auto ds = from_arrays(x, {2, 3, 1}, y);
    for (const auto& [with, without] :
         {std::pair{ds.augment({}).shuffle(10, 1).batch(4), ds.shuffle(10, 1).batch(4)},
          std::pair{ds.shuffle(10, 1).batch(4).augment({.pad = 0, .flip = false, .seed = 77}), ds.shuffle(10, 1).batch(4)}}) {
        for (std::uint64_t epoch : {0u, 3u}) {
            const auto a = pass_of(with, epoch), b = pass_of(without, epoch);
            CHECK(a.y == b.y);
            CHECK(same_bits(a.x, b.x));
        }
    }
    // And augment_image with the centre crop and no flip is a copy.
    std::vector<float> out(6);
    augment_image(std::span<const float>(x).first(6), out, 2, 3, 1, 1, {1, 1, false});
    CHECK(same_bits(out, std::span<const float>(x).first(6)));
}

TEST_CASE("augment: labels and sample weights stay with their examples; augmented() says it is there") {
    const auto ds = images(30, 4, 4, 2, /*with_weights=*/true).shuffle(30, 2).augment({.pad = 1, .flip = true, .seed = 3});
    CHECK(ds.augmented());
    CHECK(ds.batch(8).prefetch(1).augmented());
    CHECK(!images(30, 4, 4, 2).batch(8).augmented());
    CHECK(ds.example_shape() == std::vector<std::size_t>{4, 4, 2});
    CHECK(ds.batch(8).cardinality() == 4);
    const auto seen = pass_of(ds.batch(8), 0);
    REQUIRE(seen.w.size() == 30);
    for (std::size_t p = 0; p < 30; ++p) CHECK(seen.w[p] == weight_of(seen.y[p]));
}

TEST_CASE("augment: bad arguments are refused, naming what was expected and found") {
    const auto img = images(2, 28, 28, 1);
    auto msg = error_of<strata::ValueError>([&] { img.augment({.pad = -1}); });
    CHECK(has(msg, "augment: expected pad >= 0, found pad -1"));
    msg = error_of<strata::ValueError>([&] { img.augment({.pad = 28}); });
    CHECK(has(msg, "expected pad < 28"));
    CHECK(has(msg, "found pad 28 for images of 28x28 (example shape [28, 28, 1])"));
    // The smaller of height and width bounds the pad.
    msg = error_of<strata::ValueError>([&] { images(2, 8, 5, 3).augment({.pad = 5}); });
    CHECK(has(msg, "expected pad < 5"));
    CHECK(images(2, 8, 5, 3).augment({.pad = 4}).augmented());
    // Not images: flat vectors, or a rank other than 3.
    msg = error_of<strata::ShapeError>([&] { numbered(4, 784).augment({.pad = 2}); });
    CHECK(has(msg, "augment: expected images, examples of shape {H, W, C} (rank 3, channels last), "
                   "found example shape [784] (rank 1)"));
    msg = error_of<strata::ShapeError>([] {
        from_arrays(std::vector<float>(16), {1, 2, 2, 4}, std::vector<std::int32_t>{0}).augment({.flip = true});
    });
    CHECK(has(msg, "found example shape [1, 2, 2, 4] (rank 4)"));
    // augment_image checks its arguments too.
    std::vector<float> in(12), out(12), short_out(11);
    msg = error_of<strata::ShapeError>([&] { augment_image(in, short_out, 2, 3, 2, 1, {}); });
    CHECK(has(msg, "augment_image: expected 2x3x2 = 12 floats in and out, found 12 in and 11 out"));
    msg = error_of<strata::ValueError>([&] { augment_image(in, out, 2, 3, 2, 1, {3, 0, false}); });
    CHECK(has(msg, "expected crop offsets in [0, 2] (2 pad), found dy 3, dx 0"));
    msg = error_of<strata::ValueError>([&] { augment_image(in, out, 2, 3, 2, 2, {}); });
    CHECK(has(msg, "expected 0 <= pad < min(height, width) = 2, found pad 2"));
}

TEST_CASE("augment: no allocation per batch in the steady state") {
    for (bool after_batch : {false, true}) {
        CAPTURE(after_batch);
        const Augment a{.pad = 2, .flip = true, .seed = 8};
        const auto shuffled = images(3000, 6, 6, 2).shuffle(200, 1);
        const auto ds = (after_batch ? shuffled.batch(32).augment(a) : shuffled.augment(a).batch(32)).prefetch(3);
        auto it = ds.iterate(0);
        for (int i = 0; i < 10; ++i) ++it;
        std::vector<long> at_batch;
        at_batch.reserve(200);
        double sum = 0;
        g_allocations = 0;
        g_count_allocations = true;
        for (; it != std::default_sentinel; ++it) {
            sum += it->x[0];
            at_batch.push_back(g_allocations.load());
        }
        g_count_allocations = false;
        REQUIRE(at_batch.size() > 8);
        CHECK(sum >= 0);
        CHECK(at_batch[at_batch.size() - 5] == 0);
    }
}
