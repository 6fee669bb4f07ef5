// The gradient-check harness: one registry of cases, one checker. A case builds float64 inputs
// (marking which require grad) and a forward; the checker compares backward with central finite
// differences of sum(forward(inputs) * R) for a fixed random R. Adding an op = adding a case.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/op_catalogue.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mod::test {

struct GradCase {
  std::string name;  // "matmul nt [5,7] x [3,7]": op, variant, shapes
  Op op;
  std::function<std::vector<Tensor>(Rng&)> inputs;            // f64; set_requires_grad on some
  std::function<Tensor(const std::vector<Tensor>&)> forward;  // any output shape
  double tolerance = 1e-6;  // |analytic - numeric| <= tolerance * (1 + |numeric|)
};

// Called at static-init time by each grad_cases_<family>.cpp: `static const bool r = ...`.
bool register_grad_cases(std::vector<GradCase> cases);
const std::vector<GradCase>& grad_cases();

// Result of one check: the worst element and how far off it is.
struct GradReport {
  bool ok = true;
  std::string worst;  // "input 1 element 17: analytic 0.12 numeric 0.13"
  double worst_error = 0.0;
  int64_t elements_checked = 0;
};
GradReport check_gradients(const GradCase& c, uint64_t seed = 1234);

}  // namespace mod::test
