// A per-token output that carries Embedding's token mask (mask_zero) on a Pipeline: its loss and
// accuracy leave out the padded tokens, which the later stages, never seeing the ids, cannot tell.
// expect: a Pipeline's later stages never see the ids
// expect: use OneDevice, Mirrored, CentralStorage, MultiWorkerMirrored or ParameterServer
#include <strata/strata.hpp>
#include <strata/distribute/pipeline.hpp>
using namespace strata::nn;
using Lm = Sequential<Input<8>, Embedding<100, 16, EmbeddingOptions{.mask_zero = true}>, TokenDense<16, ReLU>, TokenDense<100, Softmax>>;
int main() {
    using S = strata::distribute::Pipeline<strata::place::Host, strata::distribute::OneFOneB, strata::distribute::split::At<2>>;
    S pipeline;
    strata::Model<Lm, S> model(pipeline);
    return 0;
}
