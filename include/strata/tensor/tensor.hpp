#pragma once
/// \file strata/tensor/tensor.hpp
/// `TensorView<T, Place>` (a non-owning window: pointer + shape) and `Tensor<T, Place>` (owning
/// storage on a place, plus a shape). Tensors are row-major; images are NHWC.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/fwd.hpp"
#include "strata/core/error.hpp"
#include "strata/core/half.hpp"
#include "strata/core/shape.hpp"
#include "strata/place/algorithm.hpp"
#include "strata/place/place.hpp"

namespace strata {

/// A non-owning view of `shape().size()` contiguous elements of type `T` on place `P`: an
/// arithmetic type, or one of the 16-bit floats of core/half.hpp (stored as they are; the ops
/// that compute on them say so, tensor/convert.hpp converts them).
/// Views are cheap to copy (like a pointer); they never outlive the tensor they view.
///
/// \code
/// strata::Tensor<float> t({4, 3});
/// auto rows = t.view().reshape({2, 6});   // same memory, other shape
/// \endcode
template <class T, class P>
class TensorView {
    static_assert(std::is_arithmetic_v<T> || detail::is_half_v<T>,
                  "strata::TensorView<T, Place>: T must be an arithmetic type (float, double, int32_t, ...) or a 16-bit "
                  "float (strata::bfloat16, strata::float16)");
    static_assert(place::Place<P>, "strata::TensorView<T, Place>: Place must be strata::place::Host or strata::place::Cuda");

public:
    using value_type = T;
    using place_type = P;

    TensorView() = default;
    TensorView(T* data, const Shape& shape) : data_(data), shape_(shape) {}

    T* data() const { return data_; }
    const Shape& shape() const { return shape_; }
    std::int64_t size() const { return shape_.size(); }
    int rank() const { return shape_.rank(); }
    std::int64_t dim(int i) const { return shape_.dim(i); }
    /// True for a default-constructed view or one with no elements.
    bool empty() const { return data_ == nullptr || size() == 0; }
    T* begin() const { return data_; }
    T* end() const { return data_ + size(); }

    /// The same memory seen with another shape of the same size; ShapeError otherwise.
    TensorView reshape(const Shape& s) const {
        STRATA_CHECK(s.size() == size(), ShapeError, "reshape: cannot view ", shape_, " (", size(),
                     " elements) as ", s, " (", s.size(), " elements)");
        return TensorView(data_, s);
    }
    /// Rows [first, first + count) along the first axis.
    TensorView slice(std::int64_t first, std::int64_t count) const {
        STRATA_CHECK(rank() >= 1, ShapeError, "slice: a rank-0 tensor has no rows");
        STRATA_CHECK(first >= 0 && count >= 0 && first + count <= shape_[0], ShapeError,
                     "slice: rows [", first, ", ", first + count, ") are outside a tensor of shape ", shape_);
        Shape s = shape_;
        s[0] = count;
        return TensorView(data_ + first * shape_.product(1, rank()), s);
    }

    /// Element access from host code (only for host-accessible places).
    T& operator[](std::int64_t i) const {
        static_assert(place::host_accessible_v<P>,
                      "strata::TensorView::operator[]: this place's memory is not accessible from host code; "
                      "copy the tensor to the host first with strata::to_host(t)");
        return data_[i];
    }
    template <class... I>
    T& at(I... idx) const {
        static_assert(place::host_accessible_v<P>,
                      "strata::TensorView::at: this place's memory is not accessible from host code; "
                      "copy the tensor to the host first with strata::to_host(t)");
        static_assert(sizeof...(I) >= 1, "strata::TensorView::at: give one index per axis");
        STRATA_CHECK(int(sizeof...(I)) == rank(), ShapeError, "at: ", sizeof...(I),
                     " indices given for a tensor of shape ", shape_);
        const std::int64_t ids[] = {std::int64_t(idx)...};
        std::int64_t off = 0;
        for (int a = 0; a < rank(); ++a) {
            STRATA_CHECK(ids[a] >= 0 && ids[a] < shape_[a], ShapeError, "at: index ", ids[a], " on axis ", a,
                         " is outside a tensor of shape ", shape_);
            off = off * shape_[a] + ids[a];
        }
        return data_[off];
    }

protected:
    T* data_ = nullptr;
    Shape shape_;
};

/// A tensor owning its storage on place `P` (`place::Host` by default).
///
/// Storage is allocated once; `resize` to a shape that fits the capacity reuses it, which is
/// how layers keep their workspaces across batches of different sizes without allocating.
/// Copying is explicit (`clone`, `copy_to`, `to_host`); moving is cheap.
///
/// \code
/// strata::Tensor<float> x({2, 3});
/// strata::fill(x, 1.0f);
/// strata::Tensor<float> y = x.clone();
/// \endcode
template <class T, class P>
class Tensor : public TensorView<T, P> {
    using Base = TensorView<T, P>;

public:
    Tensor() = default;
    explicit Tensor(const Shape& shape) { resize(shape); }
    Tensor(std::initializer_list<std::int64_t> dims) : Tensor(Shape(dims)) {}
    ~Tensor() { release(); }

    Tensor(const Tensor&) = delete;
    Tensor& operator=(const Tensor&) = delete;
    Tensor(Tensor&& o) noexcept { swap(o); }
    Tensor& operator=(Tensor&& o) noexcept {
        if (this != &o) {
            release();
            swap(o);
        }
        return *this;
    }

    /// Sets the shape; allocates only when the new size exceeds the capacity. Contents are
    /// unspecified after a resize that reallocates.
    void resize(const Shape& shape);
    std::size_t capacity() const { return capacity_; }
    Base view() const { return Base(this->data_, this->shape_); }

    /// A deep copy on the same place.
    Tensor clone() const {
        Tensor out(this->shape_);
        place::copy_n<P>(this->data_, this->size(), out.data());
        return out;
    }

    void swap(Tensor& o) noexcept {
        std::swap(this->data_, o.data_);
        std::swap(this->shape_, o.shape_);
        std::swap(capacity_, o.capacity_);
    }

private:
    void release() noexcept;
    std::size_t capacity_ = 0;
};

// Out of the class, not inline, so that the compiled part's instantiations below are the only
// ones (GCC instantiates inline members for inlining even where an `extern template` declares them).
template <class T, class P>
void Tensor<T, P>::resize(const Shape& shape) {
    const auto n = std::size_t(shape.size());
    if (n > capacity_) {
        release();
        this->data_ = static_cast<T*>(P::allocate(n * sizeof(T)));
        capacity_ = n;
    }
    this->shape_ = shape;
}

template <class T, class P>
void Tensor<T, P>::release() noexcept {
    if (this->data_) P::deallocate(this->data_, capacity_ * sizeof(T));
    this->data_ = nullptr;
    capacity_ = 0;
}

#if STRATA_INSTANCES
// The host tensors of the element types strata trains on and labels with, compiled once in the
// compiled part.
STRATA_TEMPLATE void Tensor<float, place::Host>::resize(const Shape&);
STRATA_TEMPLATE void Tensor<float, place::Host>::release() noexcept;
STRATA_TEMPLATE void Tensor<double, place::Host>::resize(const Shape&);
STRATA_TEMPLATE void Tensor<double, place::Host>::release() noexcept;
STRATA_TEMPLATE void Tensor<std::int32_t, place::Host>::resize(const Shape&);
STRATA_TEMPLATE void Tensor<std::int32_t, place::Host>::release() noexcept;
#endif
#if STRATA_CUDA_INSTANCES
// The CUDA place's, in libstrata_cuda (strata/config.hpp).
STRATA_CUDA_TEMPLATE void Tensor<float, place::Cuda>::resize(const Shape&);
STRATA_CUDA_TEMPLATE void Tensor<float, place::Cuda>::release() noexcept;
STRATA_CUDA_TEMPLATE void Tensor<double, place::Cuda>::resize(const Shape&);
STRATA_CUDA_TEMPLATE void Tensor<double, place::Cuda>::release() noexcept;
STRATA_CUDA_TEMPLATE void Tensor<std::int32_t, place::Cuda>::resize(const Shape&);
STRATA_CUDA_TEMPLATE void Tensor<std::int32_t, place::Cuda>::release() noexcept;
#endif

namespace detail {
template <class T, class From, class To>
void copy_between(const TensorView<T, From>& src, const TensorView<T, To>& dst) {
    const auto bytes = std::size_t(src.size()) * sizeof(T);
    if (bytes == 0) return;
    if constexpr (std::is_same_v<From, place::Host> && std::is_same_v<To, place::Host>) {
        std::memcpy(dst.data(), src.data(), bytes);
    } else {
#if STRATA_HAS_CUDA
        cudaMemcpyKind kind = std::is_same_v<From, place::Host> ? cudaMemcpyHostToDevice
                            : std::is_same_v<To, place::Host>   ? cudaMemcpyDeviceToHost
                                                                : cudaMemcpyDeviceToDevice;
        place::cuda_check(cudaMemcpyAsync(dst.data(), src.data(), bytes, kind, place::Cuda::stream()),
                          "cudaMemcpyAsync");
        place::cuda_check(cudaStreamSynchronize(place::Cuda::stream()), "cudaStreamSynchronize");
#else
        place::require_usable<To>();
        place::require_usable<From>();
#endif
    }
}
}  // namespace detail

/// Copies `src` into `dst` (same element type; the places may differ). ShapeError when the
/// sizes differ.
template <class T, class From, class To>
void copy(const TensorView<T, From>& src, const TensorView<T, To>& dst) {
    STRATA_CHECK(src.size() == dst.size(), ShapeError, "copy: source ", src.shape(), " and destination ",
                 dst.shape(), " have different sizes");
    detail::copy_between(src, dst);
}

/// A copy of `src` on place `To`.
template <class To, class T, class From>
Tensor<T, To> copy_to(const TensorView<T, From>& src) {
    place::require_usable<To>();
    Tensor<T, To> out(src.shape());
    detail::copy_between(src, out.view());
    return out;
}

/// A host copy of any tensor (what tests and printing use).
template <class T, class From>
Tensor<T, place::Host> to_host(const TensorView<T, From>& src) {
    return copy_to<place::Host>(src);
}

/// A host tensor holding `values` with `shape`.
template <class T>
Tensor<T, place::Host> from_vector(const std::vector<T>& values, const Shape& shape) {
    STRATA_CHECK(std::int64_t(values.size()) == shape.size(), ShapeError, "from_vector: ", values.size(),
                 " values do not fill shape ", shape, " (", shape.size(), " elements)");
    Tensor<T, place::Host> t(shape);
    if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
    return t;
}

/// The elements of a tensor (any place) as a std::vector.
template <class T, class P>
std::vector<T> to_vector(const TensorView<T, P>& t) {
    std::vector<T> out(std::size_t(t.size()));
    TensorView<T, place::Host> dst(out.data(), t.shape());
    detail::copy_between(t, dst);
    return out;
}

/// The rows of its last axis each example of `t` ([n, ..., last]) holds: its positions before
/// that axis, 1 for [n, last] (and for no examples). Keras' losses and metrics work along axis -1,
/// one row per token.
template <class T, class P>
std::int64_t last_axis_rows(const TensorView<T, P>& t) {
    const std::int64_t n = t.rank() > 0 ? t.dim(0) : 0;
    if (t.rank() < 3 || n == 0) return 1;
    const std::int64_t last = t.dim(t.rank() - 1);
    return last > 0 ? t.size() / (n * last) : 1;
}

}  // namespace strata
