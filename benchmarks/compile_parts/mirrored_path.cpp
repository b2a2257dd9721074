// Mirrored's gradient path alone (its copies, buckets and all-reduce), no Model.
#include "net.hpp"
int main() {
    strata::distribute::Mirrored<> s(2);
    strata::distribute::GradientPath<strata::distribute::Mirrored<>, Net, float> path(s, [](float* p) { p[0] = 0; });
    return path.units() == 2 ? 0 : 1;
}
