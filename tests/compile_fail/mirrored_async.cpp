// Mirrored cannot honour asynchronous updates: the message lists the valid combinations.
// expect: strata::distribute::Mirrored cannot honour this sync mode
// expect: Valid combinations: Default, OneDevice<P>, Mirrored<P, sync::Synchronous>
#include <strata/strata.hpp>
int main() {
    strata::distribute::Mirrored<strata::place::Host, strata::sync::Asynchronous<>> strategy(2);
}
