// The 16-bit float tests compiled by nvcc: the same cases, on Host and Cuda, plus the
// conversions and round_to run in device code against the host's, bit for bit.
#include "test_half.cpp"

namespace {
template <class H>
struct DecodeBits {
    STRATA_HD float operator()(std::int64_t i) const { return float(H::from_bits(std::uint16_t(i))); }
};
template <class H>
struct EncodeBits {
    STRATA_HD std::int32_t operator()(float x) const { return H(x).bits; }
};
template <class H>
struct RoundBits {
    STRATA_HD float operator()(float x) const { return strata::round_to<H>(x); }
};
}  // namespace

TEST_CASE_TEMPLATE("device code decodes, rounds and encodes as the host does", H, BF16, FP16) {
    using strata::place::Cuda;
    Tensor<float, Cuda> decoded(Shape{0x10000});
    strata::place::tabulate<Cuda>(decoded.data(), 0x10000, DecodeBits<H>{});
    const auto d = strata::to_vector(decoded.view());
    std::size_t bad = 0;
    for (std::uint32_t b = 0; b < 0x10000; ++b) bad += bits(d[b]) != bits(float(H::from_bits(std::uint16_t(b))));
    CHECK(bad == 0);

    const auto inputs = rounding_inputs<H>(1'000'000);
    const auto x = strata::copy_to<Cuda>(strata::from_vector(inputs, Shape{std::int64_t(inputs.size())}).view());
    Tensor<std::int32_t, Cuda> enc(x.shape());
    Tensor<float, Cuda> rnd(x.shape());
    strata::place::transform<Cuda>(x.data(), x.size(), enc.data(), EncodeBits<H>{});
    strata::place::transform<Cuda>(x.data(), x.size(), rnd.data(), RoundBits<H>{});
    const auto e = strata::to_vector(enc.view());
    const auto r = strata::to_vector(rnd.view());
    bad = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        bad += std::uint16_t(e[i]) != H(inputs[i]).bits;
        bad += bits(r[i]) != bits(strata::round_to<H>(inputs[i]));
    }
    CHECK(bad == 0);
}

TEST_CASE("gemm_tf32 on Cuda is within TF32's rounding of the float gemm") {
    using strata::place::Cuda;
    const std::int64_t m = 37, n = 29, k = 101;
    std::vector<float> av(std::size_t(m * k)), bv(std::size_t(k * n));
    SplitMix rng{5};
    for (auto& x : av) x = float(rng.next() >> 40) * 0x1p-24f - 0.5f;
    for (auto& x : bv) x = float(rng.next() >> 40) * 0x1p-24f - 0.5f;
    const auto a = strata::copy_to<Cuda>(strata::from_vector(av, Shape{m, k}).view());
    const auto b = strata::copy_to<Cuda>(strata::from_vector(bv, Shape{k, n}).view());
    Tensor<float, Cuda> c1(Shape{m, n}), c2(Shape{m, n});
    strata::gemm(Trans::No, Trans::No, 1.0f, a.view(), b.view(), 0.0f, c1.view());
    strata::gemm_tf32(Trans::No, Trans::No, 1.0f, a.view(), b.view(), 0.0f, c2.view());
    const auto v1 = strata::to_vector(c1.view()), v2 = strata::to_vector(c2.view());
    // Each input rounded to 10 fraction bits: a relative 2^-10 on each product at most.
    double worst = 0;
    for (std::size_t i = 0; i < v1.size(); ++i) worst = std::max(worst, double(std::fabs(v1[i] - v2[i])));
    MESSAGE("largest |tf32 - float| ", worst);
    CHECK(worst <= double(k) * 0.25 * 2 * 0x1p-10);
}
