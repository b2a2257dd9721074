#pragma once
/// \file strata/core/shape.hpp
/// Shapes: `Shape` (run-time, rank <= 6, what a tensor carries) and `StaticShape<D...>`
/// (compile-time per-example extents, what layers compute their output shapes with).

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <string>

#include "strata/fwd.hpp"
#include "strata/core/error.hpp"

namespace strata {

/// The run-time shape of a tensor: up to `max_rank` extents, row-major (last extent fastest).
///
/// \code
/// strata::Shape s{128, 28, 28, 1};   // NHWC batch of MNIST images
/// s.rank() == 4; s.size() == 100352; s[0] == 128;
/// \endcode
class Shape {
public:
    static constexpr int max_rank = 6;

    constexpr Shape() = default;
    Shape(std::initializer_list<std::int64_t> dims) {
        STRATA_CHECK(dims.size() <= std::size_t(max_rank), ValueError, "Shape: rank ", dims.size(),
                     " exceeds the maximum rank ", max_rank);
        for (auto d : dims) {
            STRATA_CHECK(d >= 0, ValueError, "Shape: extent ", d, " is negative");
            dims_[std::size_t(rank_++)] = d;
        }
    }
    template <class It>
    static Shape from_range(It first, It last) {
        Shape s;
        for (; first != last; ++first) s.push_back(std::int64_t(*first));
        return s;
    }

    constexpr int rank() const { return rank_; }
    constexpr std::int64_t operator[](int i) const { return dims_[std::size_t(i)]; }
    constexpr std::int64_t& operator[](int i) { return dims_[std::size_t(i)]; }
    /// Extent `i`, counting from the end when negative (`s.dim(-1)` is the last extent).
    constexpr std::int64_t dim(int i) const { return dims_[std::size_t(i < 0 ? rank_ + i : i)]; }
    /// Number of elements (1 for rank 0).
    constexpr std::int64_t size() const {
        std::int64_t n = 1;
        for (int i = 0; i < rank_; ++i) n *= dims_[std::size_t(i)];
        return n;
    }
    void push_back(std::int64_t d) {
        STRATA_CHECK(rank_ < max_rank, ValueError, "Shape: rank would exceed ", max_rank);
        STRATA_CHECK(d >= 0, ValueError, "Shape: extent ", d, " is negative");
        dims_[std::size_t(rank_++)] = d;
    }
    /// Product of the extents in [first, last).
    constexpr std::int64_t product(int first, int last) const {
        std::int64_t n = 1;
        for (int i = first; i < last; ++i) n *= dims_[std::size_t(i)];
        return n;
    }
    /// The same shape with the first extent replaced (the batch dimension).
    Shape with_batch(std::int64_t n) const {
        Shape s = *this;
        if (s.rank_ == 0) s.push_back(n); else s.dims_[0] = n;
        return s;
    }
    const std::int64_t* begin() const { return dims_.data(); }
    const std::int64_t* end() const { return dims_.data() + rank_; }

    friend constexpr bool operator==(const Shape& a, const Shape& b) {
        if (a.rank_ != b.rank_) return false;
        for (int i = 0; i < a.rank_; ++i)
            if (a.dims_[std::size_t(i)] != b.dims_[std::size_t(i)]) return false;
        return true;
    }
    friend std::ostream& operator<<(std::ostream& os, const Shape& s) {
        os << '(';
        for (int i = 0; i < s.rank_; ++i) os << (i ? ", " : "") << s.dims_[std::size_t(i)];
        if (s.rank_ == 1) os << ',';
        return os << ')';
    }
    std::string str() const {
        std::ostringstream os;
        os << *this;
        return os.str();
    }

private:
    std::array<std::int64_t, max_rank> dims_{};
    int rank_ = 0;
};

#if STRATA_INSTANCES
// A shape's text in error messages, compiled once in the compiled part.
namespace detail {
STRATA_TEMPLATE std::string stream_text<Shape>(const Shape&);
}  // namespace detail
#endif

/// Compile-time per-example extents (the batch dimension is not part of it).
/// `StaticShape<28, 28, 1>` is one MNIST image in NHWC layout.
template <std::int64_t... D>
struct StaticShape {
    static constexpr int rank = sizeof...(D);
    static constexpr std::int64_t size = (std::int64_t(1) * ... * D);
    static constexpr std::array<std::int64_t, sizeof...(D)> dims{D...};
    /// The run-time shape of a batch of `n` examples of this shape.
    static Shape batched(std::int64_t n) { return Shape{n, D...}; }
    static Shape unbatched() { return Shape{D...}; }
};

namespace detail {
template <class S>
struct is_static_shape : std::false_type {};
template <std::int64_t... D>
struct is_static_shape<StaticShape<D...>> : std::true_type {};
}  // namespace detail

/// Satisfied by `StaticShape<...>` types.
template <class S>
concept StaticShapeType = detail::is_static_shape<S>::value;

}  // namespace strata
