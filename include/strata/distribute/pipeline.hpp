#pragma once
/// \file strata/distribute/pipeline.hpp
/// `Pipeline`: the strategy (pipeline_strategy.hpp, where it is documented) and its gradient path
/// (path/pipeline.hpp), which a Model needs to train under it. The path includes the strategy's
/// header, not this one, so neither header is half of an include loop.

#include "strata/distribute/pipeline_strategy.hpp"
#include "strata/distribute/path/pipeline.hpp"
