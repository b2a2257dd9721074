// STRATA_BUILDING_COMPILED_PART is src/strata.cpp's own macro: it turns the headers' lists of
// instantiations into their definitions. Defined in a header-only unit it would define them
// there, beside the inline code, and the program would hold two copies if it linked libstrata.
// expect: STRATA_BUILDING_COMPILED_PART: src/strata.cpp is compiled with STRATA_SEPARATE_COMPILATION
#define STRATA_BUILDING_COMPILED_PART 1
#include <strata/strata.hpp>
int main() {}
