// Gradient-check harness implementation (see grad_check.h).
#include "tests/support/grad_check.h"

#include <cmath>
#include <sstream>

#include "core/autograd.h"

namespace mod::test {

namespace {
std::vector<GradCase>& registry() {
  static std::vector<GradCase> cases;
  return cases;
}

double projected(const Tensor& out, const Tensor& r) {
  double total = 0.0;
  for (int64_t i = 0; i < out.numel(); ++i) total += out.at(i) * r.at(i);
  return total;
}
}  // namespace

bool register_grad_cases(std::vector<GradCase> cases) {
  for (auto& c : cases) registry().push_back(std::move(c));
  return true;
}

const std::vector<GradCase>& grad_cases() { return registry(); }

GradReport check_gradients(const GradCase& c, uint64_t seed) {
  Rng rng(seed);
  std::vector<Tensor> inputs = c.inputs(rng);
  Tensor out = c.forward(inputs);
  Tensor r = randn(out.shape(), rng, out.dtype());
  out.backward(r);

  GradReport report;
  constexpr double kStep = 1e-6;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    if (!x.grad().defined()) {
      report.ok = false;
      report.worst = "input " + std::to_string(i) + " got no gradient";
      return report;
    }
    for (int64_t e = 0; e < x.numel(); ++e) {
      const double orig = x.at(e);
      double plus, minus;
      {
        NoGradGuard no_grad;
        x.set(e, orig + kStep);
        plus = projected(c.forward(inputs), r);
        x.set(e, orig - kStep);
        minus = projected(c.forward(inputs), r);
        x.set(e, orig);
      }
      const double numeric = (plus - minus) / (2 * kStep);
      const double analytic = x.grad().at(e);
      const double err = std::abs(analytic - numeric) / (1.0 + std::abs(numeric));
      ++report.elements_checked;
      if (err > report.worst_error) {
        report.worst_error = err;
        std::ostringstream os;
        os << "input " << i << " " << shape_str(x.shape()) << " element " << e << ": analytic "
           << analytic << " numeric " << numeric;
        report.worst = os.str();
      }
      if (err > c.tolerance) report.ok = false;
    }
  }
  return report;
}

}  // namespace mod::test
