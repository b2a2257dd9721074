// The precompiled header of the test units built alike (tests/meson.build, "One precompiled
// header"): doctest and strata's umbrella, parsed once for all of them instead of once a unit.
// Meson compiles it for the library strata_test_pch, with those units' own flags; each unit then
// takes it with -include, and -Werror=invalid-pch makes a header compiled with other flags an
// error instead of a silent parse.
#include <doctest/doctest.h>
#include <strata/strata.hpp>
