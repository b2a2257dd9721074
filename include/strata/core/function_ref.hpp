#pragma once
/// \file strata/core/function_ref.hpp
/// `FunctionRef<R(Args...)>`: a non-owning reference to a callable (a lambda, a function, a
/// function pointer), two pointers wide, called through one indirect call; the C++26
/// `std::function_ref`'s idea. A function that takes its callbacks as FunctionRef is not a
/// template, so its code is compiled once (in the compiled part, libstrata, or once per
/// translation unit header-only) instead of once per lambda that calls it; and unlike
/// std::function it never allocates.
///
/// It refers to the callable it was made from, which must outlive it: take it as a parameter
/// and call it before returning, never store it. An empty one (default, nullptr, or a null
/// function pointer) is false and must not be called.

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace strata {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
public:
    FunctionRef() noexcept = default;
    FunctionRef(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor): "no callback"

    template <class F>
        requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
    FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): a lambda at the call site
    {
        using Callable = std::remove_reference_t<F>;
        if constexpr (std::is_pointer_v<std::remove_cvref_t<F>>) {
            if (!f) return;  // a null function pointer: empty
        }
        object_ = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
        call_ = [](void* object, Args... args) -> R {
            return std::invoke(*static_cast<Callable*>(object), std::forward<Args>(args)...);
        };
    }

    R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }
    explicit operator bool() const noexcept { return call_ != nullptr; }

private:
    void* object_ = nullptr;
    R (*call_)(void*, Args...) = nullptr;
};

}  // namespace strata
