// A Model under Mirrored, constructed and compiled: no fit, no evaluate.
#include "net.hpp"
int main() {
    strata::distribute::Mirrored<> s(2);
    strata::Model<Net, strata::distribute::Mirrored<>> model(s, 42);
    model.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::RMSprop{.learning_rate = 1e-3});
    return 0;
}
