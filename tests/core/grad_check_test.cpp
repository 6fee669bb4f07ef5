// Runs every registered gradient case, and fails if a differentiable op in the catalogue has
// none: a new op cannot land without its finite-difference check.
#include <catch2/catch.hpp>

#include <set>

#include "tests/support/grad_check.h"

using namespace mod;

TEST_CASE("every differentiable op has a gradient case", "[grad]") {
  std::set<Op> covered;
  for (const auto& c : test::grad_cases()) covered.insert(c.op);
  for (size_t i = 0; i < static_cast<size_t>(Op::Count); ++i) {
    const Op op = static_cast<Op>(i);
    if (!op_differentiable(op) || op_collective(op)) continue;  // collectives: tests/parallel
    INFO("op " << op_name(op));
    CHECK(covered.count(op) == 1);
  }
}

TEST_CASE("backward matches central finite differences in float64", "[grad]") {
  REQUIRE(!test::grad_cases().empty());
  for (const auto& c : test::grad_cases()) {
    DYNAMIC_SECTION(c.name) {
      const test::GradReport r = test::check_gradients(c);
      INFO(c.name << ": worst " << r.worst << " (relative error " << r.worst_error << ", "
                  << r.elements_checked << " elements)");
      CHECK(r.elements_checked > 0);
      CHECK(r.ok);
    }
  }
}
