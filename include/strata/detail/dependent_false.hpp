#pragma once
namespace strata::detail {
/// False, but only once instantiated: lets a primary template fail with a message.
template <class...>
inline constexpr bool dependent_false = false;
template <auto...>
inline constexpr bool dependent_false_v = false;
}  // namespace strata::detail
