// A sync-mode knob out of range.
// expect: strata::sync::KSync<K>: K must be >= 1
#include <strata/strata.hpp>
int main() {
    strata::sync::KSync<0> mode;
    (void)mode;
}
