// The seed CNN every part below compiles (the README's network).
#pragma once
#include <strata/strata.hpp>
using Net = strata::nn::Sequential<strata::nn::Input<28, 28, 1>, strata::nn::Conv2D<32, 3, strata::nn::ReLU>,
                                   strata::nn::MaxPooling2D<2>, strata::nn::Conv2D<64, 3, strata::nn::ReLU>,
                                   strata::nn::MaxPooling2D<2>, strata::nn::Flatten, strata::nn::Dense<64, strata::nn::ReLU>,
                                   strata::nn::Dense<10, strata::nn::Softmax>>;
