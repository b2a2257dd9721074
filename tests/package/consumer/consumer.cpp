// A tiny downstream program: includes the umbrella header, multiplies two matrices and checks
// the answer, then trains a small model a step, saves it and loads it into another (the code
// the compiled part holds: with STRATA_SEPARATE_COMPILATION it must come from libstrata).
// Exit 0 when the library works from this way of consuming it.
#include <strata/strata.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

int main() {
    auto a = strata::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
    auto b = strata::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
    strata::Tensor<float> c({2, 2});
    strata::gemm(strata::Trans::No, strata::Trans::No, 1.0f, a.view(), b.view(), 0.0f, c.view());
    const bool ok = c.at(0, 0) == 4 && c.at(0, 1) == 5 && c.at(1, 0) == 10 && c.at(1, 1) == 11 &&
                    strata::sum(c.view()) == 30.0;
    std::printf("consumer: c = [[%g, %g], [%g, %g]] -> %s\n", c.at(0, 0), c.at(0, 1), c.at(1, 0), c.at(1, 1),
                ok ? "ok" : "WRONG");
    if (!ok) return 1;

    using namespace strata::nn;
    using Net = Sequential<Input<3>, Dense<4, Tanh>, Dense<2, Softmax>>;
    strata::Model<Net> m(5);
    m.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    m.fit(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, std::vector<std::int32_t>{0, 1, 0, 1},
          {.epochs = 1, .verbose = 0, .batch_size = 2});
    // One file per process: the package checks run side by side, and one's remove must not
    // take another's checkpoint away between its save and its load.
    const auto file = std::filesystem::temp_directory_path() / ("strata_consumer_" + std::to_string(::getpid()) + ".safetensors");
    m.save(file.string());
    strata::Model<Net> n(9);
    n.compile(strata::loss::SparseCategoricalCrossentropy{}, strata::optim::Adam{});
    n.load(file.string());
    std::filesystem::remove(file);
    const bool same = n.get_weights() == m.get_weights() && n.epoch() == 1;
    std::printf("consumer: checkpoint round trip (%s) -> %s\n", STRATA_HEADER_ONLY ? "header-only" : "compiled part",
                same ? "ok" : "WRONG");
    return same ? 0 : 1;
}
