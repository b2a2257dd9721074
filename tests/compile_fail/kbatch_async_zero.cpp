// A K of zero for K-batch-async: refused where the value is a template argument.
// expect: strata::sync::KBatchAsync<K>: K must be >= 1
#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>
int main() {
    strata::distribute::ParameterServer<strata::place::Host, strata::sync::KBatchAsync<0>> ps(4, 1);
}
