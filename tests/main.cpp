// The one doctest main shared by every host test binary (compiled once, linked into each).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
