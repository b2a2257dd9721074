// The CUDA place's compiled part (libstrata_cuda) is built on libstrata: a unit that declares
// its instantiations extern (STRATA_SEPARATE_COMPILATION_CUDA) without libstrata's macro would
// compile libstrata's code inline and link libstrata_cuda's copy of it too.
// expect: STRATA_SEPARATE_COMPILATION_CUDA needs STRATA_SEPARATE_COMPILATION too
#define STRATA_SEPARATE_COMPILATION_CUDA 1
#include <strata/strata.hpp>
int main() {}
