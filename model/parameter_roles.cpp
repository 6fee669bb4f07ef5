// Parameter roles by name (see parameter_roles.h).
#include "model/parameter_roles.h"

namespace mod::model {

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

ParameterRole parameter_role(const std::string& name) {
  if (ends_with(name, ".bias") || name.find("norm") != std::string::npos)
    return ParameterRole::NormOrBias;
  if (name.rfind("embed.", 0) == 0) return ParameterRole::Embedding;
  return ParameterRole::Matrix;
}

bool is_causal_predictor(const std::string& name) {
  return name.rfind("blocks.", 0) == 0 && name.find(".predictor.") != std::string::npos;
}

bool read_as_master(const std::string& name) {
  if (name.rfind("embed.", 0) == 0) return true;
  if (name.rfind("blocks.", 0) != 0) return false;
  return name.find(".router.") != std::string::npos ||  // MoD's router.proj, MoE's mlp.router
         name.find(".predictor.out.") != std::string::npos;
}

}  // namespace mod::model
