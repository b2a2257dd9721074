// Tensor core: every op against a simple float64 reference on random inputs of awkward sizes.
// The same source is compiled for Host (g++) and, as test_tensor.cu, for Host + Cuda (nvcc).
#include <doctest/doctest.h>

#include "test_util.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <vector>

#include <strata/tensor/tensor_all.hpp>

#include "test_places.hpp"

using strata::Shape;
using strata::Tensor;

using strata_test::reference_values;

namespace {

template <class T, class P>
Tensor<T, P> make(const Shape& shape, std::uint64_t seed, double lo = -1, double hi = 1) {
    auto v = reference_values(shape.size(), seed, lo, hi);
    std::vector<T> t(v.begin(), v.end());
    return strata::copy_to<P>(strata::from_vector(t, shape).view());
}

template <class T, class P>
std::vector<double> as_double(const strata::TensorView<T, P>& t) {
    auto v = strata::to_vector(t);
    return std::vector<double>(v.begin(), v.end());
}

template <class T>
double tol() { return sizeof(T) == 4 ? 1e-5 : 1e-12; }

const std::int64_t sizes[] = {1, 2, 7, 13, 97, 1009, 65537};

}  // namespace

TEST_CASE_TEMPLATE("fill, copy and round trips between places", P, STRATA_TEST_PLACES) {
    for (auto n : sizes) {
        Tensor<float, P> t(Shape{n});
        strata::fill(t.view(), 2.5f);
        for (float x : strata::to_vector(t.view())) REQUIRE(x == 2.5f);
        auto src = make<double, P>(Shape{n, 1}, 3);
        Tensor<double, P> dst(Shape{n, 1});
        strata::copy(src.view(), dst.view());
        CHECK(strata::to_vector(dst.view()) == strata::to_vector(src.view()));
        auto back = strata::to_host(src.view());
        CHECK(back.shape() == Shape{n, 1});
    }
    Tensor<float, P> a(Shape{3}), b(Shape{4});
    CHECK_THROWS_AS(strata::copy(a.view(), b.view()), strata::ShapeError);
}

TEST_CASE_TEMPLATE("element-wise arithmetic matches float64", T, float, double) {
    using P = strata::place::Host;
    for (auto n : sizes) {
        auto a = make<T, P>(Shape{n}, 1), b = make<T, P>(Shape{n}, 2, 0.5, 2.0);
        auto ra = as_double(a.view()), rb = as_double(b.view());
        Tensor<T, P> out(Shape{n});
        auto check = [&](auto op, auto ref) {
            op();
            auto o = as_double(out.view());
            for (std::int64_t i = 0; i < n; ++i) REQUIRE(o[std::size_t(i)] == doctest::Approx(ref(ra[std::size_t(i)], rb[std::size_t(i)])).epsilon(tol<T>()));
        };
        check([&] { strata::add(a.view(), b.view(), out.view()); }, [](double x, double y) { return x + y; });
        check([&] { strata::sub(a.view(), b.view(), out.view()); }, [](double x, double y) { return x - y; });
        check([&] { strata::mul(a.view(), b.view(), out.view()); }, [](double x, double y) { return x * y; });
        check([&] { strata::div(a.view(), b.view(), out.view()); }, [](double x, double y) { return x / y; });
        check([&] { strata::scale(a.view(), T(3), out.view()); }, [](double x, double) { return 3 * x; });
        check([&] { strata::add_scalar(a.view(), T(-2), out.view()); }, [](double x, double) { return x - 2; });
        check([&] { strata::copy(b.view(), out.view()); strata::axpy(T(0.5), a.view(), out.view()); },
              [](double x, double y) { return 0.5 * x + y; });
        check([&] { strata::copy(b.view(), out.view()); strata::axpby(T(2), a.view(), T(-1), out.view()); },
              [](double x, double y) { return 2 * x - y; });
        check([&] { strata::map(a.view(), out.view(), [](T x) { return x * x; }); }, [](double x, double) { return x * x; });
    }
    Tensor<T, P> a(Shape{3}), b(Shape{2, 2}), out(Shape{3});
    CHECK_THROWS_WITH_AS(strata::add(a.view(), b.view(), out.view()), doctest::Contains("(2, 2)"), strata::ShapeError);
}

TEST_CASE_TEMPLATE("add_bias broadcasts over the last axis", P, STRATA_TEST_PLACES) {
    for (std::int64_t rows : {1, 5, 31}) {
        for (std::int64_t c : {1, 3, 64}) {
            auto x = make<float, P>(Shape{rows, 2, c}, 5);
            auto bias = make<float, P>(Shape{c}, 6);
            auto rx = as_double(x.view()), rb = as_double(bias.view());
            strata::add_bias(x.view(), bias.view());
            auto o = as_double(x.view());
            for (std::size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == doctest::Approx(rx[i] + rb[i % std::size_t(c)]).epsilon(1e-6));
        }
    }
    Tensor<float, P> x(Shape{2, 3}), bad(Shape{2});
    CHECK_THROWS_AS(strata::add_bias(x.view(), bad.view()), strata::ShapeError);
}

TEST_CASE_TEMPLATE("whole-tensor reductions match float64", P, STRATA_TEST_PLACES) {
    for (auto n : sizes) {
        auto x = make<float, P>(Shape{n}, 7, -3, 5);
        auto r = as_double(x.view());
        double s = 0, mx = r[0], mn = r[0];
        std::int64_t am = 0;
        for (std::size_t i = 0; i < r.size(); ++i) {
            s += r[i];
            if (r[i] > mx) { mx = r[i]; am = std::int64_t(i); }
            mn = std::min(mn, r[i]);
        }
        CHECK(double(strata::sum(x.view())) == doctest::Approx(s).epsilon(1e-12));
        CHECK(strata::mean(x.view()) == doctest::Approx(s / double(n)).epsilon(1e-12));
        CHECK(double(strata::max(x.view())) == mx);
        CHECK(double(strata::min(x.view())) == mn);
        CHECK(strata::argmax(x.view()) == am);
    }
    Tensor<float, P> empty(Shape{0});
    CHECK(strata::sum(empty.view()) == 0.0);
    CHECK_THROWS_AS(strata::max(empty.view()), strata::ValueError);
}

namespace {
// Functors for the place algorithms' test (STRATA_HD: they run on the GPU in test_tensor.cu).
struct CountVisit {
    int* hits;
    template <class I>
    STRATA_HD void operator()(I i) const { hits[i] += 1; }
};
struct Affine {
    STRATA_HD double operator()(std::int64_t i) const { return double(i % 7) * 3.0 - double(i % 5); }
};
struct AsInt {
    STRATA_HD std::int64_t operator()(double v) const { return std::int64_t(v); }
};
struct AddInt {
    STRATA_HD std::int64_t operator()(std::int64_t a, std::int64_t b) const { return a + b; }
};
}  // namespace

// place/algorithm.hpp: the loops every op is written with. Each index is visited once for any
// thread count; reductions give the same result for any thread count, ties and NaNs included
// (the host folds one block per thread, so an answer that depended on the blocks would differ
// between 1 and 5 threads; the sizes put ties and NaNs at block edges and inside blocks).
TEST_CASE_TEMPLATE("place algorithms: every index once, the same result for any thread count", P, STRATA_TEST_PLACES) {
    const int threads_before = strata::num_threads();
    for (int threads : {1, 2, 3, 5}) {
        strata::set_num_threads(threads);
        CAPTURE(threads);
        for (auto n : sizes) {
            CAPTURE(n);
            Tensor<int, P> hits(Shape{n});
            strata::fill(hits.view(), 0);
            strata::place::for_each_n<P>(n, CountVisit{hits.data()});
            strata::place::for_each_n<P>(std::int32_t(n), CountVisit{hits.data()});
            strata::place::for_each_n<P>(std::int64_t(0), CountVisit{hits.data()});   // nothing
            strata::place::for_each_n<P>(std::int64_t(-3), CountVisit{hits.data()});  // nothing
            for (int h : strata::to_vector(hits.view())) REQUIRE(h == 2);

            Tensor<double, P> t(Shape{n});
            strata::place::tabulate<P>(t.data(), n, Affine{});
            const auto tv = strata::to_vector(t.view());
            std::int64_t ref_sum = 0;
            for (std::int64_t i = 0; i < n; ++i) {
                REQUIRE(tv[std::size_t(i)] == Affine{}(i));
                ref_sum += std::int64_t(Affine{}(i));
            }
            CHECK(strata::place::transform_reduce<P>(t.data(), n, AsInt{}, std::int64_t(11), AddInt{}) == ref_sum + 11);

            // Equal maxima in the first, a middle and the last position: the first wins.
            std::vector<float> v(std::size_t(n), 1.0f);
            for (std::int64_t k : {n - 1, n / 2, n / 3}) v[std::size_t(k)] = 4.0f;
            const std::int64_t first_max = std::min({n - 1, n / 2, n / 3});
            auto x = strata::copy_to<P>(strata::from_vector(v, Shape{n}).view());
            CHECK(strata::argmax(x.view()) == first_max);
            CHECK(strata::max(x.view()) == 4.0f);
            CHECK(strata::min(x.view()) == *std::min_element(v.begin(), v.end()));

            // NaNs (the last element, and one at a third): max and min are NaN, argmax the first NaN.
            v[std::size_t(n - 1)] = std::nanf("");
            v[std::size_t(n / 3)] = std::nanf("");
            auto y = strata::copy_to<P>(strata::from_vector(v, Shape{n}).view());
            CHECK(std::isnan(strata::max(y.view())));
            CHECK(std::isnan(strata::min(y.view())));
            CHECK(strata::argmax(y.view()) == n / 3);
        }
    }
    strata::set_num_threads(threads_before);
}

TEST_CASE_TEMPLATE("the float sum is accurate", P, STRATA_TEST_PLACES) {
    // 2^24 * 1.5 is exactly representable, but a float accumulator stalls at 2^24 + ...
    Tensor<float, P> ones(Shape{std::int64_t(1) << 24});
    strata::fill(ones.view(), 1.5f);
    CHECK(strata::sum(ones.view()) == 1.5 * double(1 << 24));
    // 10^7 random floats against a float64 sum of the same floats.
    auto x = make<float, P>(Shape{10000000}, 11, 0, 1);
    double ref = 0;
    for (float v : strata::to_vector(x.view())) ref += double(v);
    CHECK(std::abs(double(strata::sum(x.view())) - ref) <= 1e-6 * std::abs(ref));
    // The grouping of partial sums does not depend on the number of threads.
    if constexpr (std::is_same_v<P, strata::place::Host>) {
        const int before = strata::num_threads();
        strata::set_num_threads(1);
        const double one = strata::sum(x.view());
        strata::set_num_threads(2);
        const double two = strata::sum(x.view());
        strata::set_num_threads(before);
        CHECK(one == two);
    }
}

TEST_CASE_TEMPLATE("axis reductions match float64 on every axis", P, STRATA_TEST_PLACES) {
    const Shape shapes[] = {Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{1, 13, 1}, Shape{1009, 3}, Shape{300, 2, 5}};
    for (const auto& shape : shapes) {
        auto x = make<double, P>(shape, 13);
        auto r = as_double(x.view());
        for (int axis = 0; axis < shape.rank(); ++axis) {
            const std::int64_t outer = shape.product(0, axis), len = shape[axis], inner = shape.product(axis + 1, shape.rank());
            Tensor<double, P> s(Shape{outer * inner}), m(Shape{outer * inner}), mx(Shape{outer * inner}), mn(Shape{outer * inner});
            strata::sum(x.view(), axis, s.view());
            strata::mean(x.view(), axis, m.view());
            strata::max(x.view(), axis, mx.view());
            strata::min(x.view(), axis, mn.view());
            auto vs = as_double(s.view()), vm = as_double(m.view()), vmx = as_double(mx.view()), vmn = as_double(mn.view());
            for (std::int64_t o = 0; o < outer; ++o)
                for (std::int64_t i = 0; i < inner; ++i) {
                    double rs = 0, rmx = -1e300, rmn = 1e300;
                    for (std::int64_t k = 0; k < len; ++k) {
                        const double v = r[std::size_t((o * len + k) * inner + i)];
                        rs += v;
                        rmx = std::max(rmx, v);
                        rmn = std::min(rmn, v);
                    }
                    const auto j = std::size_t(o * inner + i);
                    REQUIRE(vs[j] == doctest::Approx(rs).epsilon(1e-12));
                    REQUIRE(vm[j] == doctest::Approx(rs / double(len)).epsilon(1e-12));
                    REQUIRE(vmx[j] == rmx);
                    REQUIRE(vmn[j] == rmn);
                }
        }
        Tensor<double, P> wrong(Shape{shape.size() + 1});
        CHECK_THROWS_AS(strata::sum(x.view(), 0, wrong.view()), strata::ShapeError);
        CHECK_THROWS_AS(strata::sum(x.view(), shape.rank(), wrong.view()), strata::ShapeError);
    }
}

TEST_CASE("the Cuda axis reduction's launch shape fills a GPU (checked on the host)") {
    // issue 18: the host's 64-block column sums ran as 64 GPU threads. The Cuda form's shape is a
    // constexpr function of the tensor's shape; an H100 and an H200 have 132 SMs.
    using strata::detail::cuda_reduce_shape;
    constexpr std::int64_t sms = 132;
    // The bias gradient of Dense<64> at batch 128: [128, 64] summed over axis 0.
    constexpr auto small = cuda_reduce_shape(1, 128, 64);
    static_assert(small.threads() >= sms * 32, "at least a warp per SM for a 128 x 64 column sum");
    static_assert(small.blocks() >= 32);
    // The convolutions' bias gradients at batch 128: [128 * 26 * 26, 32] and [128 * 11 * 11, 64].
    constexpr auto conv1 = cuda_reduce_shape(1, 128 * 26 * 26, 32), conv2 = cuda_reduce_shape(1, 128 * 11 * 11, 64);
    static_assert(conv1.blocks() >= sms * 4 && conv2.blocks() >= sms * 4, "several blocks per SM for the big slabs");
    static_assert(conv1.threads() >= sms * 1024);
    // Every shape covers every row and column exactly once.
    const std::int64_t shapes[][3] = {{1, 1, 1}, {1, 3, 1000}, {1, 1000, 3}, {1, 128, 64}, {1, 4097, 33},
                                      {3, 1000, 1}, {1000, 3, 1}, {7, 0, 5}, {2, 100000, 7}};
    for (const auto& sh : shapes) {
        const auto s = cuda_reduce_shape(sh[0], sh[1], sh[2]);
        CAPTURE(sh[0]);
        CAPTURE(sh[1]);
        CAPTURE(sh[2]);
        CHECK(s.width * s.lanes == strata::detail::CudaReduceShape::block_threads);
        CHECK(s.tiles * s.width >= sh[2]);
        CHECK((s.tiles - 1) * s.width < sh[2]);
        CHECK(s.chunks * s.rows_per_chunk >= sh[1]);
        CHECK(s.chunks >= 1);
        CHECK(s.chunks <= strata::detail::CudaReduceShape::max_chunks);
        if (sh[1] > 0) CHECK((s.chunks - 1) * s.rows_per_chunk < sh[1]);  // no empty chunk
        CHECK(s.rows_per_chunk >= s.lanes);
        // The second pass: every (chunk, output) partial read once, and no lane adds more than a
        // few partials one after the other (a block or two of long serial loops was 20 us a call).
        if (!s.two_pass()) continue;
        const std::int64_t cols = sh[0] * sh[2];
        const auto f = strata::detail::cuda_finish_shape(s.chunks, cols);
        CHECK(f.width * f.lanes == strata::detail::CudaReduceShape::block_threads);
        CHECK(f.chunks == 1);
        CHECK(f.rows_per_chunk == s.chunks);
        CHECK(f.tiles * f.width >= cols);
        CHECK((f.tiles - 1) * f.width < cols);
        CHECK((s.chunks + f.lanes - 1) / f.lanes <= 4);
    }
    // The bias gradients' second pass at batch 128: a block per output, 4 partials per lane.
    constexpr auto conv1_finish = strata::detail::cuda_finish_shape(conv1.chunks, 32);
    static_assert(conv1.two_pass() && conv1_finish.blocks() == 32 && conv1_finish.lanes == 256);
}

TEST_CASE_TEMPLATE("softmax and argmax of rows", P, STRATA_TEST_PLACES) {
    for (std::int64_t cols : {1, 2, 10, 97}) {
        const std::int64_t rows = 17;
        auto x = make<double, P>(Shape{rows, cols}, 17, -50, 50);
        // Large logits must not overflow.
        auto big = as_double(x.view());
        Tensor<double, P> y(Shape{rows, cols});
        Tensor<std::int32_t, P> am(Shape{rows});
        strata::softmax(x.view(), y.view());
        strata::argmax_rows(x.view(), am.view());
        auto vy = as_double(y.view());
        auto vam = strata::to_vector(am.view());
        for (std::int64_t r = 0; r < rows; ++r) {
            double m = -1e300;
            std::int32_t best = 0;
            for (std::int64_t c = 0; c < cols; ++c) {
                if (big[std::size_t(r * cols + c)] > m) { m = big[std::size_t(r * cols + c)]; best = std::int32_t(c); }
            }
            double z = 0;
            for (std::int64_t c = 0; c < cols; ++c) z += std::exp(big[std::size_t(r * cols + c)] - m);
            for (std::int64_t c = 0; c < cols; ++c)
                REQUIRE(vy[std::size_t(r * cols + c)] == doctest::Approx(std::exp(big[std::size_t(r * cols + c)] - m) / z).epsilon(1e-12));
            REQUIRE(vam[std::size_t(r)] == best);
        }
    }
    Tensor<float, P> huge(Shape{1, 3});
    strata::fill(huge.view(), 1e30f);
    strata::softmax(huge.view(), huge.view());
    for (float v : strata::to_vector(huge.view())) CHECK(v == doctest::Approx(1.0 / 3));
}

TEST_CASE_TEMPLATE("gemm: every transpose combination on non-square shapes", P, STRATA_TEST_PLACES) {
    struct Dims { std::int64_t m, n, k; };
    const Dims cases[] = {{1, 1, 1}, {2, 3, 5}, {7, 13, 1}, {31, 1, 17}, {64, 10, 288}, {129, 65, 33}};
    for (auto [m, n, k] : cases) {
        for (auto ta : {strata::Trans::No, strata::Trans::Yes}) {
            for (auto tb : {strata::Trans::No, strata::Trans::Yes}) {
                const Shape sa = ta == strata::Trans::No ? Shape{m, k} : Shape{k, m};
                const Shape sb = tb == strata::Trans::No ? Shape{k, n} : Shape{n, k};
                auto a = make<double, P>(sa, 21), b = make<double, P>(sb, 22), c = make<double, P>(Shape{m, n}, 23);
                auto fa = make<float, P>(sa, 21), fb = make<float, P>(sb, 22), fc = make<float, P>(Shape{m, n}, 23);
                auto ra = as_double(a.view()), rb = as_double(b.view()), rc = as_double(c.view());
                strata::gemm(ta, tb, 0.5, a.view(), b.view(), -2.0, c.view());
                strata::gemm(ta, tb, 0.5f, fa.view(), fb.view(), -2.0f, fc.view());
                auto vc = as_double(c.view()), vfc = as_double(fc.view());
                for (std::int64_t i = 0; i < m; ++i)
                    for (std::int64_t j = 0; j < n; ++j) {
                        double s = 0;
                        for (std::int64_t p = 0; p < k; ++p) {
                            const double av = ta == strata::Trans::No ? ra[std::size_t(i * k + p)] : ra[std::size_t(p * m + i)];
                            const double bv = tb == strata::Trans::No ? rb[std::size_t(p * n + j)] : rb[std::size_t(j * k + p)];
                            s += av * bv;
                        }
                        const double ref = 0.5 * s - 2.0 * rc[std::size_t(i * n + j)];
                        REQUIRE(vc[std::size_t(i * n + j)] == doctest::Approx(ref).epsilon(1e-12));
                        REQUIRE(vfc[std::size_t(i * n + j)] == doctest::Approx(ref).epsilon(1e-4));
                    }
            }
        }
    }
    Tensor<float, P> a(Shape{2, 3}), b(Shape{4, 5}), c(Shape{2, 5});
    CHECK_THROWS_WITH_AS(strata::gemm(strata::Trans::No, strata::Trans::No, 1.0f, a.view(), b.view(), 0.0f, c.view()),
                         doctest::Contains("(4, 5)"), strata::ShapeError);
}

TEST_CASE_TEMPLATE("random init is reproducible and well distributed", P, STRATA_TEST_PLACES) {
    Tensor<float, P> u(Shape{100003}), u2(Shape{100003}), n(Shape{100003});
    strata::random_uniform(u.view(), -2.0f, 3.0f, 42);
    strata::random_uniform(u2.view(), -2.0f, 3.0f, 42);
    CHECK(strata::to_vector(u.view()) == strata::to_vector(u2.view()));
    auto vu = as_double(u.view());
    double mean = 0;
    for (double v : vu) { REQUIRE(v >= -2.0); REQUIRE(v < 3.0); mean += v; }
    CHECK(mean / double(vu.size()) == doctest::Approx(0.5).epsilon(0.02));
    strata::random_uniform(u2.view(), -2.0f, 3.0f, 43);
    CHECK(strata::to_vector(u.view()) != strata::to_vector(u2.view()));
    strata::random_normal(n.view(), 1.0f, 2.0f, 7);
    auto vn = as_double(n.view());
    double m = 0, v2 = 0;
    for (double v : vn) m += v;
    m /= double(vn.size());
    for (double v : vn) v2 += (v - m) * (v - m);
    CHECK(m == doctest::Approx(1.0).epsilon(0.03));
    CHECK(std::sqrt(v2 / double(vn.size())) == doctest::Approx(2.0).epsilon(0.02));
    // Element i depends only on (seed, stream, i): the host computes the same numbers.
    // Element i depends only on (seed, stream, i): the host computes the same bits, for every
    // element (on Cuda this is the promise that host and GPU initialise identically: no FMA
    // contraction, no place-specific log or cos).
    for (std::size_t i = 0; i < vu.size(); ++i) {
        REQUIRE(float(vu[i]) == strata::random::uniform_at<float>(42, 0, i, -2.0f, 3.0f));
        REQUIRE(float(vn[i]) == strata::random::normal_at<float>(7, 0, i, 1.0f, 2.0f));
    }
    Tensor<double, P> ud(Shape{4099}), nd(Shape{4099});
    strata::random_uniform(ud.view(), -0.3, 0.7, 11, 3);
    strata::random_normal(nd.view(), 0.0, 0.05, 11, 3);
    const auto vud = strata::to_vector(ud.view()), vnd = strata::to_vector(nd.view());
    for (std::size_t i = 0; i < vud.size(); ++i) {
        REQUIRE(vud[i] == strata::random::uniform_at<double>(11, 3, i, -0.3, 0.7));
        REQUIRE(vnd[i] == strata::random::normal_at<double>(11, 3, i, 0.0, 0.05));
    }
}

TEST_CASE("the portable log and cos of the normal stream are accurate") {
    // They replace std::log and std::cos so that host and CUDA round alike; they must still be
    // the functions they claim to be: within 4 ulp (log) and 1e-15 (cos) of the library's.
    const auto ulps = [](double a, double b) {
        std::int64_t x, y;
        std::memcpy(&x, &a, 8);
        std::memcpy(&y, &b, 8);
        return x > y ? x - y : y - x;
    };
    std::int64_t worst_log = 0;
    double worst_cos = 0;
    for (std::int64_t i = 1; i <= 200000; ++i) {
        const double u = double(i) / 200000.0;
        const double x = 1.0 - u * (1.0 - std::ldexp(1.0, -53));  // (0, 1], as 1 - uniform01
        worst_log = std::max(worst_log, ulps(strata::random::detail::portable_log(x), std::log(x)));
        const double c = strata::random::detail::portable_cos_2pi(u - 1.0 / 400000.0);
        worst_cos = std::max(worst_cos, std::abs(c - std::cos(6.283185307179586476925 * (u - 1.0 / 400000.0))));
    }
    CHECK(worst_log <= 4);
    CHECK(worst_cos <= 1e-15);
    for (int e : {-53, -30, -1}) CHECK(ulps(strata::random::detail::portable_log(std::ldexp(1.0, e)), std::log(std::ldexp(1.0, e))) <= 1);
    CHECK(strata::random::detail::portable_log(1.0) == 0.0);
    CHECK(strata::random::detail::portable_cos_2pi(0.0) == 1.0);
    CHECK(strata::random::detail::portable_cos_2pi(0.5) == -1.0);
}

TEST_CASE("tensor storage and views") {
    Tensor<float> t({4, 3});
    CHECK(t.size() == 12);
    CHECK(t.shape() == Shape{4, 3});
    auto cap = t.capacity();
    const float* p = t.data();
    t.resize(Shape{2, 3});
    CHECK(t.data() == p);  // shrinking reuses storage
    CHECK(t.capacity() == cap);
    t.resize(Shape{4, 3});
    for (std::int64_t i = 0; i < 12; ++i) t[i] = float(i);
    CHECK(t.at(2, 1) == 7.0f);
    CHECK_THROWS_AS(t.at(4, 0), strata::ShapeError);
    auto rows = t.view().slice(1, 2);
    CHECK(rows.shape() == Shape{2, 3});
    CHECK(rows[0] == 3.0f);
    CHECK_THROWS_AS(t.view().slice(3, 2), strata::ShapeError);
    CHECK_THROWS_WITH_AS(t.view().reshape({5, 2}), doctest::Contains("(5, 2)"), strata::ShapeError);
    auto moved = std::move(t);
    CHECK(moved.size() == 12);
    CHECK(t.data() == nullptr);
    auto c = moved.clone();
    CHECK(c.data() != moved.data());
    CHECK(strata::to_vector(c.view()) == strata::to_vector(moved.view()));
}
