#pragma once
/// \file strata/tensor/gemm.hpp
/// General matrix multiply on row-major 2-D tensors: `C = alpha * op(A) * op(B) + beta * C`,
/// through CBLAS on the host and cuBLAS on CUDA. A and B may also be 16-bit floats
/// (core/half.hpp) with C float (float accumulation), and float GEMMs may run on CUDA's TF32
/// tensor cores (`gemm_tf32`).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/core/half.hpp"
#include "strata/tensor/tensor.hpp"
#include "strata/place/threads.hpp"

extern "C" {
#include <cblas.h>
}
#if STRATA_HAS_CUDA
#include <cublas_v2.h>
#endif

namespace strata {

/// Whether a GEMM operand is used as stored or transposed.
enum class Trans { No, Yes };

namespace detail {
template <class T>
void cblas_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, int lda,
                const T* b, int ldb, T beta, T* c, int ldc) {
    const auto ca = ta == Trans::No ? CblasNoTrans : CblasTrans;
    const auto cb = tb == Trans::No ? CblasNoTrans : CblasTrans;
    if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, ca, cb, int(m), int(n), int(k), alpha, a, lda, b, ldb, beta, c, ldc);
    else
        cblas_dgemm(CblasRowMajor, ca, cb, int(m), int(n), int(k), alpha, a, lda, b, ldb, beta, c, ldc);
}

#if defined(STRATA_BLAS_OPENBLAS)
extern "C" char* openblas_get_corename(void);
#endif

/// The BLAS's thread pool is kept at one thread (see host_gemm), once per process. With
/// OpenBLAS, also warns once when it picked kernels far older than the CPU (it does on CPUs it
/// does not know, e.g. under some hypervisors): OPENBLAS_CORETYPE fixes that.
STRATA_DECL bool blas_init_once();

/// Host GEMM on the calling thread's OpenMP team: C is cut into one block of rows (or of
/// columns, when C is wide) per thread and each block is one single-threaded BLAS call.
/// strata owns the host threads this way: a BLAS with its own thread pool would spin against
/// the OpenMP team between calls (measured: it halves the MNIST CNN's speed on 2 cores), and
/// replica threads each get exactly their share of cores.
template <class T>
void host_gemm(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, int lda,
               const T* b, int ldb, T beta, T* c, int ldc) {
    blas_init_once();
#if STRATA_HAS_OPENMP
    const int threads = omp_get_max_threads();
    // Below ~1 MFLOP a parallel region costs more than it saves.
    if (threads > 1 && double(m) * double(n) * double(k) >= 5e5 && !omp_in_parallel()) {
        const bool split_rows = m >= n;
        const std::int64_t extent = split_rows ? m : n;
        const int parts = int(extent < threads ? extent : threads);
#pragma omp parallel for num_threads(parts) schedule(static, 1)
        for (int p = 0; p < parts; ++p) {
            const std::int64_t first = extent * p / parts, last = extent * (p + 1) / parts;
            if (split_rows) {
                const T* ap = ta == Trans::No ? a + first * lda : a + first;
                cblas_gemm(ta, tb, last - first, n, k, alpha, ap, lda, b, ldb, beta, c + first * ldc, ldc);
            } else {
                const T* bp = tb == Trans::No ? b + first : b + first * ldb;
                cblas_gemm(ta, tb, m, last - first, k, alpha, a, lda, bp, ldb, beta, c + first, ldc);
            }
        }
        return;
    }
#endif
    cblas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
}  // namespace detail

#if STRATA_HAS_CUDA
namespace detail {
inline cublasHandle_t cublas_handle() {
    // One handle per thread: each replica thread drives its own stream, and cuBLAS handles
    // must not be shared between concurrently working host threads.
    struct Holder {
        cublasHandle_t h = nullptr;
        ~Holder() { if (h) cublasDestroy(h); }
    };
    thread_local Holder holder;
    if (!holder.h && cublasCreate(&holder.h) != CUBLAS_STATUS_SUCCESS)
        throw_error<DeviceError>("cuBLAS: cublasCreate failed (is a GPU present and the driver loaded?)");
    cublasSetStream(holder.h, place::Cuda::stream());
    return holder.h;
}
inline void cublas_check(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) throw_error<DeviceError>("cuBLAS: ", what, " failed with status ", int(s));
}
}  // namespace detail
#endif

namespace detail {
/// While alive (and `on`), this thread's cuBLAS handle runs float GEMMs (`gemm`,
/// `gemm_strided_batched`) on TF32 tensor cores (CUBLAS_TF32_TENSOR_OP_MATH): what
/// precision::TF32 asks of a network's pass on a CUDA place (nn::Network sets it around forward
/// and backward). The handle's mode is restored at the end. On other places it does nothing.
template <class P>
class Tf32Scope {
public:
    explicit Tf32Scope(bool on) {
#if STRATA_HAS_CUDA
        if constexpr (std::is_same_v<P, place::Cuda>) {
            if (!on) return;
            handle_ = cublas_handle();
            cublas_check(cublasGetMathMode(handle_, &before_), "cublasGetMathMode");
            cublas_check(cublasSetMathMode(handle_, CUBLAS_TF32_TENSOR_OP_MATH), "cublasSetMathMode (TF32)");
        }
#endif
        (void)on;
    }
    ~Tf32Scope() {
#if STRATA_HAS_CUDA
        if (handle_) cublasSetMathMode(handle_, before_);
#endif
    }
    Tf32Scope(const Tf32Scope&) = delete;
    Tf32Scope& operator=(const Tf32Scope&) = delete;

private:
#if STRATA_HAS_CUDA
    cublasHandle_t handle_ = nullptr;
    cublasMath_t before_ = CUBLAS_DEFAULT_MATH;
#endif
};
}  // namespace detail

namespace detail {
struct GemmExtents {
    std::int64_t m, n, k;
};
/// m, n, k of `C = op(A) op(B)`; ShapeError naming the three shapes when they do not fit.
inline GemmExtents gemm_extents(const char* name, Trans ta, Trans tb, const Shape& a, const Shape& b, const Shape& c) {
    STRATA_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2, ShapeError, name, ": operands must be matrices, got A ",
                 a, ", B ", b, ", C ", c);
    const std::int64_t m = ta == Trans::No ? a.dim(0) : a.dim(1);
    const std::int64_t k = ta == Trans::No ? a.dim(1) : a.dim(0);
    const std::int64_t kb = tb == Trans::No ? b.dim(0) : b.dim(1);
    const std::int64_t n = tb == Trans::No ? b.dim(1) : b.dim(0);
    STRATA_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, ShapeError, name, ": op(A) ", m, "x", k, " times op(B) ", kb, "x", n,
                 " cannot give C ", c, " (A ", a, ta == Trans::Yes ? " transposed" : "", ", B ", b,
                 tb == Trans::Yes ? " transposed" : "", ")");
    return {m, n, k};
}
}  // namespace detail

/// `C = alpha * op(A) * op(B) + beta * C` for row-major matrices, op(X) = X or X^T.
/// op(A) is [m, k], op(B) is [k, n], C is [m, n]; anything else throws ShapeError naming the
/// three shapes.
///
/// \code
/// strata::Tensor<float> a({2, 3}), b({4, 3}), c({2, 4});
/// strata::gemm(strata::Trans::No, strata::Trans::Yes, 1.0f, a, b, 0.0f, c);   // c = a * b^T
/// \endcode
template <class T, class P>
void gemm(Trans ta, Trans tb, T alpha, const TensorView<T, P>& a, const TensorView<T, P>& b, T beta,
          const TensorView<T, P>& c) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "strata::gemm: T must be float or double");
    const auto [m, n, k] = detail::gemm_extents("gemm", ta, tb, a.shape(), b.shape(), c.shape());
    if (m == 0 || n == 0) return;
    const auto lda = int(a.dim(1)), ldb = int(b.dim(1)), ldc = int(c.dim(1));
    if constexpr (std::is_same_v<P, place::Host>) {
        if (k == 0) {  // BLAS implementations differ on k == 0; the answer is beta * C.
            for (std::int64_t i = 0; i < c.size(); ++i) c.data()[i] = beta == T(0) ? T(0) : beta * c.data()[i];
            return;
        }
        detail::host_gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
    } else {
#if STRATA_HAS_CUDA
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
        const auto oa = ta == Trans::No ? CUBLAS_OP_N : CUBLAS_OP_T;
        const auto ob = tb == Trans::No ? CUBLAS_OP_N : CUBLAS_OP_T;
        auto h = detail::cublas_handle();
        if constexpr (std::is_same_v<T, float>)
            detail::cublas_check(cublasSgemm(h, ob, oa, int(n), int(m), int(k), &alpha, b.data(), ldb, a.data(), lda, &beta, c.data(), ldc), "cublasSgemm");
        else
            detail::cublas_check(cublasDgemm(h, ob, oa, int(n), int(m), int(k), &alpha, b.data(), ldb, a.data(), lda, &beta, c.data(), ldc), "cublasDgemm");
#else
        place::require_usable<P>();
#endif
    }
}

namespace detail {
/// A grow-only float buffer per thread for the host's 16-bit GEMM (`slot` 0 for A, 1 for B), so
/// that a training step's steady state does not allocate.
inline float* half_gemm_scratch(int slot, std::int64_t n) {
    thread_local std::vector<float> buffers[2];
    auto& v = buffers[slot];
    if (std::int64_t(v.size()) < n) v.resize(std::size_t(n));
    return v.data();
}
#if STRATA_HAS_CUDA
template <class H>
constexpr cudaDataType_t cuda_data_type() {
    if constexpr (std::is_same_v<H, bfloat16>)
        return CUDA_R_16BF;
    else if constexpr (std::is_same_v<H, float16>)
        return CUDA_R_16F;
    else
        return CUDA_R_32F;
}
#endif
}  // namespace detail

/// `C = alpha * op(A) * op(B) + beta * C` with A and B 16-bit floats (both `bfloat16` or both
/// `float16`) and C float: the products of the 16-bit values are exact in float and are added
/// in float (what mixed-precision training multiplies with). Shapes as in `gemm` (ShapeError
/// otherwise).
///
/// Host: A and B are converted to float (exactly) and multiplied by the float GEMM; correct,
/// not fast (no 16-bit arithmetic on the host). Cuda: `cublasGemmEx` with 16-bit inputs
/// (CUDA_R_16BF / CUDA_R_16F), float output and CUBLAS_COMPUTE_32F.
///
/// \code
/// strata::Tensor<strata::bfloat16> a({2, 3}), b({3, 4});
/// strata::Tensor<float> c({2, 4});
/// strata::gemm(strata::Trans::No, strata::Trans::No, 1.0f, a.view(), b.view(), 0.0f, c.view());
/// \endcode
template <class H, class P>
    requires detail::is_half_v<H>
void gemm(Trans ta, Trans tb, float alpha, const TensorView<H, P>& a, const TensorView<H, P>& b, float beta,
          const TensorView<float, P>& c) {
    const auto [m, n, k] = detail::gemm_extents("gemm", ta, tb, a.shape(), b.shape(), c.shape());
    if (m == 0 || n == 0) return;
    const auto lda = int(a.dim(1)), ldb = int(b.dim(1)), ldc = int(c.dim(1));
    if constexpr (std::is_same_v<P, place::Host>) {
        if (k == 0) {  // BLAS implementations differ on k == 0; the answer is beta * C.
            for (std::int64_t i = 0; i < c.size(); ++i) c.data()[i] = beta == 0.0f ? 0.0f : beta * c.data()[i];
            return;
        }
        float* af = detail::half_gemm_scratch(0, a.size());
        float* bf = detail::half_gemm_scratch(1, b.size());
        place::transform<P>(a.data(), a.size(), af, [](H x) { return float(x); });
        place::transform<P>(b.data(), b.size(), bf, [](H x) { return float(x); });
        detail::host_gemm(ta, tb, m, n, k, alpha, af, lda, bf, ldb, beta, c.data(), ldc);
    } else {
#if STRATA_HAS_CUDA
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
        const auto oa = ta == Trans::No ? CUBLAS_OP_N : CUBLAS_OP_T;
        const auto ob = tb == Trans::No ? CUBLAS_OP_N : CUBLAS_OP_T;
        constexpr auto type = detail::cuda_data_type<std::remove_cv_t<H>>();
        detail::cublas_check(cublasGemmEx(detail::cublas_handle(), ob, oa, int(n), int(m), int(k), &alpha, b.data(), type, ldb,
                                          a.data(), type, lda, &beta, c.data(), CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
                             "cublasGemmEx (16-bit inputs)");
#else
        place::require_usable<P>();
#endif
    }
}

/// The float `gemm`, allowed to use TF32 on CUDA: `cublasGemmEx` with
/// CUBLAS_COMPUTE_32F_FAST_TF32, whose tensor cores round A and B to 10 fraction bits before
/// multiplying (accumulation stays float). Where no TF32 exists (the host), it is the float
/// `gemm` itself, exactly. A mixed-precision policy chooses between the two.
template <class P>
void gemm_tf32(Trans ta, Trans tb, float alpha, const TensorView<float, P>& a, const TensorView<float, P>& b, float beta,
               const TensorView<float, P>& c) {
    if constexpr (std::is_same_v<P, place::Cuda>) {
#if STRATA_HAS_CUDA
        const auto [m, n, k] = detail::gemm_extents("gemm_tf32", ta, tb, a.shape(), b.shape(), c.shape());
        if (m == 0 || n == 0) return;
        const auto lda = int(a.dim(1)), ldb = int(b.dim(1)), ldc = int(c.dim(1));
        const auto oa = ta == Trans::No ? CUBLAS_OP_N : CUBLAS_OP_T;
        const auto ob = tb == Trans::No ? CUBLAS_OP_N : CUBLAS_OP_T;
        detail::cublas_check(cublasGemmEx(detail::cublas_handle(), ob, oa, int(n), int(m), int(k), &alpha, b.data(), CUDA_R_32F,
                                          ldb, a.data(), CUDA_R_32F, lda, &beta, c.data(), CUDA_R_32F, ldc,
                                          CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                             "cublasGemmEx (TF32)");
#else
        place::require_usable<P>();
#endif
    } else {
        gemm(ta, tb, alpha, a, b, beta, c);
    }
}

namespace detail {
/// C_b = beta · C_b for every matrix of a strided batch (a GEMM with k == 0), one value per index.
template <class T>
struct ScaleMatrices {
    T* c;
    std::int64_t m, n, ldc, stride_c;
    T beta;
    STRATA_HD void operator()(std::int64_t i) const {
        const std::int64_t b = i / (m * n), r = i / n % m, j = i % n;
        T& v = c[b * stride_c + r * ldc + j];
        v = beta == T(0) ? T(0) : beta * v;
    }
};
}  // namespace detail

/// `batch` GEMMs of row-major matrices at fixed strides (BLAS' strided batched GEMM):
/// C_b = alpha · op(A_b) · op(B_b) + beta · C_b for b in [0, batch), with X_b = x + b · stride_x,
/// op(A_b) [m, k], op(B_b) [k, n], C_b [m, n], and leading dimensions lda, ldb, ldc (the row
/// lengths of the stored matrices). Attention's per-head products (one [tokens, tokens] score
/// matrix per example and head) are one call.
///
/// Host: the batch is split over the calling thread's OpenMP team, one single-threaded BLAS
/// call per matrix (each is small; host_gemm's reasons for owning the threads hold), or serial
/// below ~1 MFLOP in all. Cuda: one `cublas{S,D}gemmStridedBatched` launch on this thread's
/// stream. The matrices of C must not overlap.
template <class T, class P>
void gemm_strided_batched(Trans ta, Trans tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
                          std::int64_t stride_a, const T* b, std::int64_t ldb, std::int64_t stride_b, T beta, T* c, std::int64_t ldc,
                          std::int64_t stride_c, std::int64_t batch) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "strata::gemm_strided_batched: T must be float or double");
    STRATA_CHECK(m >= 0 && n >= 0 && k >= 0 && batch >= 0 && ldc >= n && lda >= (ta == Trans::No ? k : m) &&
                     ldb >= (tb == Trans::No ? n : k),
                 ShapeError, "gemm_strided_batched: m ", m, ", n ", n, ", k ", k, ", batch ", batch, " do not fit lda ", lda,
                 ", ldb ", ldb, ", ldc ", ldc);
    if (m == 0 || n == 0 || batch == 0) return;
    if constexpr (std::is_same_v<P, place::Host>) {
        auto one = [&](std::int64_t i) {
            T* ci = c + i * stride_c;
            if (k == 0) {  // BLAS implementations differ on k == 0; the answer is beta * C.
                for (std::int64_t r = 0; r < m; ++r)
                    for (std::int64_t j = 0; j < n; ++j) ci[r * ldc + j] = beta == T(0) ? T(0) : beta * ci[r * ldc + j];
                return;
            }
            detail::cblas_gemm(ta, tb, m, n, k, alpha, a + i * stride_a, int(lda), b + i * stride_b, int(ldb), beta, ci, int(ldc));
        };
        detail::blas_init_once();
#if STRATA_HAS_OPENMP
        const int threads = omp_get_max_threads();
        if (threads > 1 && batch > 1 && double(m) * double(n) * double(k) * double(batch) >= 5e5 && !omp_in_parallel()) {
#pragma omp parallel for num_threads(int(batch < threads ? batch : threads)) schedule(static)
            for (std::int64_t i = 0; i < batch; ++i) one(i);
            return;
        }
#endif
        for (std::int64_t i = 0; i < batch; ++i) one(i);
    } else {
#if STRATA_HAS_CUDA
        if (k == 0) {
            place::for_each_n<P>(batch * m * n, detail::ScaleMatrices<T>{c, m, n, ldc, stride_c, beta});
            return;
        }
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
        const auto oa = ta == Trans::No ? CUBLAS_OP_N : CUBLAS_OP_T;
        const auto ob = tb == Trans::No ? CUBLAS_OP_N : CUBLAS_OP_T;
        auto h = detail::cublas_handle();
        if constexpr (std::is_same_v<T, float>)
            detail::cublas_check(cublasSgemmStridedBatched(h, ob, oa, int(n), int(m), int(k), &alpha, b, int(ldb), stride_b, a, int(lda),
                                                           stride_a, &beta, c, int(ldc), stride_c, int(batch)),
                                 "cublasSgemmStridedBatched");
        else
            detail::cublas_check(cublasDgemmStridedBatched(h, ob, oa, int(n), int(m), int(k), &alpha, b, int(ldb), stride_b, a, int(lda),
                                                           stride_a, &beta, c, int(ldc), stride_c, int(batch)),
                                 "cublasDgemmStridedBatched");
#else
        place::require_usable<P>();
#endif
    }
}

#if STRATA_INSTANCES
// The host GEMMs depend on nothing of the user's network: compiled once in the compiled part.
// (nvcc's units keep instantiating the Cuda ones.)
namespace detail {
STRATA_TEMPLATE void host_gemm<float>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, float, const float*, int,
                                      const float*, int, float, float*, int);
STRATA_TEMPLATE void host_gemm<double>(Trans, Trans, std::int64_t, std::int64_t, std::int64_t, double, const double*, int,
                                       const double*, int, double, double*, int);
}  // namespace detail
STRATA_TEMPLATE void gemm<float, place::Host>(Trans, Trans, float, const TensorView<float, place::Host>&,
                                              const TensorView<float, place::Host>&, float, const TensorView<float, place::Host>&);
STRATA_TEMPLATE void gemm<double, place::Host>(Trans, Trans, double, const TensorView<double, place::Host>&,
                                               const TensorView<double, place::Host>&, double, const TensorView<double, place::Host>&);
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE void gemm<float, place::Cuda>(Trans, Trans, float, const TensorView<float, place::Cuda>&, const TensorView<float, place::Cuda>&, float, const TensorView<float, place::Cuda>&);
STRATA_CUDA_TEMPLATE void gemm<double, place::Cuda>(Trans, Trans, double, const TensorView<double, place::Cuda>&, const TensorView<double, place::Cuda>&, double, const TensorView<double, place::Cuda>&);
#endif

}  // namespace strata

#if STRATA_DEFINITIONS
#include "strata/tensor/impl/gemm.ipp"
#endif
