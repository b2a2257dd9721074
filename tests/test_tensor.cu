// The tensor tests compiled by nvcc: the same cases, on Host and Cuda.
#include "test_tensor.cpp"

// issue 18: the Cuda axis reductions have their own shape (tensor/reduce.hpp's cuda_reduce);
// they are checked here against a float64 host reference on odd shapes, every axis, and run
// twice to check that the result is the same bit for bit.
namespace {
template <class T>
void check_cuda_axis_reductions(const Shape& shape, std::uint64_t seed) {
    using strata::place::Cuda;
    auto host = make<T, strata::place::Host>(shape, seed, -2, 3);
    auto x = strata::copy_to<Cuda>(host.view());
    const auto r = as_double(host.view());  // the values as the GPU sees them, widened exactly
    for (int axis = 0; axis < shape.rank(); ++axis) {
        const std::int64_t outer = shape.product(0, axis), len = shape[axis], inner = shape.product(axis + 1, shape.rank());
        CAPTURE(shape);
        CAPTURE(axis);
        Tensor<T, Cuda> s(Shape{outer * inner}), s2(Shape{outer * inner}), m(Shape{outer * inner}),
            mx(Shape{outer * inner}), mn(Shape{outer * inner});
        strata::sum(x.view(), axis, s.view());
        strata::sum(x.view(), axis, s2.view());
        strata::mean(x.view(), axis, m.view());
        strata::max(x.view(), axis, mx.view());
        strata::min(x.view(), axis, mn.view());
        const auto vs = strata::to_vector(s.view()), vs2 = strata::to_vector(s2.view());
        const auto vm = strata::to_vector(m.view()), vmx = strata::to_vector(mx.view()), vmn = strata::to_vector(mn.view());
        CHECK(vs == vs2);
        // The float result is the double sum rounded once: half an ulp of T, plus the double
        // accumulation's own error (a few ulps of double times the sum of magnitudes).
        const double rel = sizeof(T) == 4 ? 1e-7 : 1e-15;
        for (std::int64_t o = 0; o < outer; ++o)
            for (std::int64_t i = 0; i < inner; ++i) {
                double rs = 0, mag = 0, rmx = -1e300, rmn = 1e300;
                for (std::int64_t k = 0; k < len; ++k) {
                    const double v = r[std::size_t((o * len + k) * inner + i)];
                    rs += v;
                    mag += std::abs(v);
                    rmx = std::max(rmx, v);
                    rmn = std::min(rmn, v);
                }
                const auto j = std::size_t(o * inner + i);
                const double slack = 1e-13 * mag;
                REQUIRE(std::abs(double(vs[j]) - rs) <= rel * std::abs(rs) + slack);
                REQUIRE(std::abs(double(vm[j]) - rs / double(len)) <= rel * std::abs(rs / double(len)) + slack / double(len));
                REQUIRE(double(vmx[j]) == rmx);
                REQUIRE(double(vmn[j]) == rmn);
            }
    }
}
}  // namespace

TEST_CASE_TEMPLATE("Cuda column sums and axis reductions match float64 on odd shapes", T, float, double) {
    const Shape shapes[] = {Shape{1, 1}, Shape{3, 1000}, Shape{1000, 3}, Shape{128, 64}, Shape{4097, 33},
                            Shape{86528, 32}, Shape{5, 300, 7}, Shape{2, 70000, 1}};
    std::uint64_t seed = 101;
    for (const auto& shape : shapes) check_cuda_axis_reductions<T>(shape, seed++);
}

TEST_CASE("Cuda column sums of an empty axis are zero, and int sums are exact") {
    using strata::place::Cuda;
    Tensor<float, Cuda> empty(Shape{0, 5}), out(Shape{5});
    strata::fill(out.view(), 7.0f);
    strata::sum(empty.view(), 0, out.view());
    for (float v : strata::to_vector(out.view())) CHECK(v == 0.0f);
    std::vector<std::int32_t> ints(3000 * 3);
    for (std::size_t i = 0; i < ints.size(); ++i) ints[i] = std::int32_t(i % 1000) - 400;
    auto xi = strata::copy_to<Cuda>(strata::from_vector(ints, Shape{3000, 3}).view());
    Tensor<std::int32_t, Cuda> si(Shape{3});
    strata::sum(xi.view(), 0, si.view());
    const auto got = strata::to_vector(si.view());
    for (std::int64_t c = 0; c < 3; ++c) {
        std::int64_t ref = 0;
        for (std::int64_t r = 0; r < 3000; ++r) ref += ints[std::size_t(r * 3 + c)];
        CHECK(got[std::size_t(c)] == ref);
    }
}
