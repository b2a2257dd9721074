#pragma once
/// \file strata/nn/layers.hpp
/// Every layer and the Sequential model: include this for strata::nn as a whole.
///
/// \code
/// #include <strata/nn/layers.hpp>
/// using namespace strata::nn;
/// using Mnist = Sequential<Input<28, 28, 1>, Conv2D<32, 3, ReLU>, MaxPooling2D<2>, Conv2D<64, 3, ReLU>,
///                          MaxPooling2D<2>, Flatten, Dropout<25>, Dense<64, ReLU>, Dense<10, Softmax>>;
/// using ResNet = Sequential<Input<32, 32, 3>, Conv2D<16, 3, ReLU, 1, Padding::Same>,
///                           Residual<Conv2D<16, 3, ReLU, 1, Padding::Same>, Conv2D<16, 3, Linear, 1, Padding::Same>, ReLU>,
///                           Residual<Projection<32, 2>, Conv2D<32, 3, ReLU, 2, Padding::Same>,
///                                    Conv2D<32, 3, Linear, 1, Padding::Same>, ReLU>,
///                           GlobalAveragePooling2D, Dense<10, Softmax>>;
/// \endcode

#include "strata/nn/activation.hpp"
#include "strata/nn/activation_layer.hpp"
#include "strata/nn/average_pooling2d.hpp"
#include "strata/nn/batch_normalization.hpp"
#include "strata/nn/class_token.hpp"
#include "strata/nn/conv2d.hpp"
#include "strata/nn/dense.hpp"
#include "strata/nn/dropout.hpp"
#include "strata/nn/embedding.hpp"
#include "strata/nn/flatten.hpp"
#include "strata/nn/global_average_pooling1d.hpp"
#include "strata/nn/layer.hpp"
#include "strata/nn/layer_normalization.hpp"
#include "strata/nn/max_pooling2d.hpp"
#include "strata/nn/multi_head_attention.hpp"
#include "strata/nn/patch_embedding.hpp"
#include "strata/nn/position_embedding.hpp"
#include "strata/nn/residual.hpp"
#include "strata/nn/sequential.hpp"
#include "strata/nn/token_dense.hpp"
