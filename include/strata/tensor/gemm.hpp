#pragma once
/// \file strata/tensor/gemm.hpp
/// General matrix multiply on row-major 2-D tensors: `C = alpha * op(A) * op(B) + beta * C`,
/// through CBLAS on the host and cuBLAS on CUDA.

#include <cstdint>
#include <type_traits>

#include "strata/tensor/tensor.hpp"

extern "C" {
#include <cblas.h>
}
#if STRATA_HAS_CUDA
#include <cublas_v2.h>
#endif

namespace strata {

/// Whether a GEMM operand is used as stored or transposed.
enum class Trans { No, Yes };

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
    STRATA_CHECK(a.rank() == 2 && b.rank() == 2 && c.rank() == 2, ShapeError, "gemm: operands must be matrices, got A ",
                 a.shape(), ", B ", b.shape(), ", C ", c.shape());
    const std::int64_t m = ta == Trans::No ? a.dim(0) : a.dim(1);
    const std::int64_t k = ta == Trans::No ? a.dim(1) : a.dim(0);
    const std::int64_t kb = tb == Trans::No ? b.dim(0) : b.dim(1);
    const std::int64_t n = tb == Trans::No ? b.dim(1) : b.dim(0);
    STRATA_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n, ShapeError, "gemm: op(A) ", m, "x", k, " times op(B) ", kb, "x", n,
                 " cannot give C ", c.shape(), " (A ", a.shape(), ta == Trans::Yes ? " transposed" : "", ", B ", b.shape(),
                 tb == Trans::Yes ? " transposed" : "", ")");
    if (m == 0 || n == 0) return;
    const auto lda = int(a.dim(1)), ldb = int(b.dim(1)), ldc = int(c.dim(1));
    if constexpr (std::is_same_v<P, place::Host>) {
        if (k == 0) {  // BLAS implementations differ on k == 0; the answer is beta * C.
            for (std::int64_t i = 0; i < c.size(); ++i) c.data()[i] = beta == T(0) ? T(0) : beta * c.data()[i];
            return;
        }
        const auto ca = ta == Trans::No ? CblasNoTrans : CblasTrans;
        const auto cb = tb == Trans::No ? CblasNoTrans : CblasTrans;
        if constexpr (std::is_same_v<T, float>)
            cblas_sgemm(CblasRowMajor, ca, cb, int(m), int(n), int(k), alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        else
            cblas_dgemm(CblasRowMajor, ca, cb, int(m), int(n), int(k), alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
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

}  // namespace strata
