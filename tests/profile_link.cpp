// tests/check_profile_link.py compiles this unit with the compiled part (STRATA_SEPARATE_COMPILATION)
// and STRATA_PROFILE set one way or the other, and links it with libstrata: the setting libstrata
// was built with links; the other must fail, naming it (strata/core/profile.hpp).
#include <strata/core/profile.hpp>

int main() { return strata::profile::enabled ? 1 : 0; }
