// The op catalogue: every op has a name of its own, since autograd's errors and the op profile
// print it. (Its rows' count and order are static_asserts in core/op_catalogue.h.)
#include "core/op_catalogue.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>

using namespace mod;

TEST_CASE("every op has a name of its own", "[autograd]") {
  std::map<std::string, size_t> first_op_named;
  for (size_t i = 0; i < static_cast<size_t>(Op::Count); ++i) {
    const char* name = op_name(static_cast<Op>(i));
    INFO("op " << i);
    REQUIRE(name != nullptr);
    CHECK(std::string(name).size() > 0);
    const auto [it, fresh] = first_op_named.emplace(name, i);
    INFO("\"" << name << "\" also names op " << it->second);
    CHECK(fresh);
  }
}
