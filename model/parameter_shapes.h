// The names and shapes of a Transformer's parameters from its config alone, in
// named_parameters() order, without building anything: what a weights file or a checkpoint
// must hold, checked before a model of that config is allocated. The layer constructors
// (model/block.cpp, layers.cpp, moe.cpp) are the truth; tests/model hold this list to them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/tensor.h"

namespace mod::model {

std::vector<std::pair<std::string, Shape>> parameter_shapes(const modtrain::ModelConfig& cfg);

}  // namespace mod::model
