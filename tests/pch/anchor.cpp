// The one unit of strata_test_pch (tests/meson.build, "One precompiled header"): the library
// exists to have Meson compile tests/pch/strata_tests.hpp with the test units' flags.
namespace strata_test_pch {
int anchor() { return 0; }
}  // namespace strata_test_pch
