// Gradient cases for recompute regions: one input and one parameter the region captures, both
// ways of keeping (inputs only; costly op outputs), and a region with two outputs.
#include "core/all_ops.h"
#include "core/recompute.h"
#include "tests/support/grad_check.h"

namespace mod::test {
namespace {

Tensor leaf(const Shape& s, Rng& rng) {
  return randn(s, rng, DType::F64).set_requires_grad(true);
}

// in[0] enters the region as its input; in[1] is a parameter fn uses without being given it.
GradCase mlp_region_case(const char* name, RegionKeeps keeps) {
  return {name, Op::Recompute,
          [](Rng& rng) {
            return std::vector<Tensor>{leaf({2, 3, 5}, rng), leaf({4, 5}, rng)};
          },
          [keeps](const std::vector<Tensor>& in) {
            const Tensor w = in[1];
            auto fn = [w](const std::vector<Tensor>& x) {
              return std::vector<Tensor>{gelu(matmul(silu(x[0]), w, false, true))};
            };
            return recompute_region(fn, {in[0]}, keeps)[0];
          }};
}

const bool registered = register_grad_cases({
    mlp_region_case("recompute silu-linear-gelu [2,3,5], inputs only", RegionKeeps::InputsOnly),
    mlp_region_case("recompute silu-linear-gelu [2,3,5], costly outputs kept",
                    RegionKeeps::CostlyOpOutputs),
    {"recompute two outputs [3,4]", Op::RecomputeOutput,
     [](Rng& rng) {
       return std::vector<Tensor>{leaf({3, 4}, rng), leaf({4, 4}, rng)};
     },
     [](const std::vector<Tensor>& in) {
       auto fn = [](const std::vector<Tensor>& x) {
         Tensor h = matmul(x[0], x[1]);
         return std::vector<Tensor>{sigmoid(h), mul(h, h)};
       };
       const std::vector<Tensor> out = recompute_region(fn, in, RegionKeeps::CostlyOpOutputs);
       return add(out[0], scale(out[1], 0.5));
     }},
});

}  // namespace
}  // namespace mod::test
