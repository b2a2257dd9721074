#pragma once
/// \file strata/distribute/parameter_server.hpp
/// `ParameterServer`: the strategy (parameter_server_strategy.hpp, where it is documented) and its gradient path
/// (path/parameter_server.hpp), which a Model needs to train under it. The path includes the strategy's
/// header, not this one, so neither header is half of an include loop.

#include "strata/distribute/parameter_server_strategy.hpp"
#include "strata/distribute/path/parameter_server.hpp"
