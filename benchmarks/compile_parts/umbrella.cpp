// #include <strata/strata.hpp> and nothing else: what every part below starts from.
#include <strata/strata.hpp>
int main() { return 0; }
