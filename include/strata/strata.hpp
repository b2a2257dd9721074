#pragma once
/// \file strata/strata.hpp
/// The one header a user includes: the whole of strata.
///
/// Sub-headers (strata/tensor/tensor_all.hpp, strata/nn/..., strata/distribute/...) stay
/// includable on their own for those who care about compile time.

#include "strata/config.hpp"
#include "strata/core/error.hpp"
#include "strata/core/random.hpp"
#include "strata/core/shape.hpp"
#include "strata/place/place.hpp"
#include "strata/place/threads.hpp"
#include "strata/tensor/tensor_all.hpp"
