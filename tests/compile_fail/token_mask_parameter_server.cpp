// A per-token output that carries Embedding's token mask (mask_zero) under ParameterServer: its
// loss is the mean over the tokens that count in each global batch, which its workers, stepping
// on their own, do not share.
// expect: ParameterServer's workers step on their own
// expect: use OneDevice, Mirrored, CentralStorage or MultiWorkerMirrored
#include <strata/strata.hpp>
#include <strata/distribute/parameter_server.hpp>
using namespace strata::nn;
using Lm = Sequential<Input<8>, Embedding<100, 16, EmbeddingOptions{.mask_zero = true}>, TokenDense<100, Softmax>>;
using Ps = strata::distribute::ParameterServer<>;
int main() {
    Ps strategy(2, 1);
    strata::Model<Lm, Ps> model(strategy);
    return 0;
}
