// A bitwise comparison of two value lists that, failing, names the first differing element
// and its two values instead of printing both lists (a parameter's can be 10^5 numbers, and
// Catch formatting them for every failed check takes minutes).
#pragma once

#include <catch2/catch.hpp>
#include <cstddef>
#include <iomanip>
#include <sstream>
#include <vector>

namespace mod::test {

inline void check_bitwise(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  size_t first = 0;
  while (first < got.size() && got[first] == want[first]) ++first;
  if (first == got.size()) {
    SUCCEED();
    return;
  }
  size_t differ = 0;
  for (size_t i = first; i < got.size(); ++i) differ += got[i] != want[i];
  std::ostringstream msg;
  msg << std::setprecision(17) << differ << " of " << got.size()
      << " elements differ, the first at " << first << ": " << got[first] << " against "
      << want[first];
  FAIL_CHECK(msg.str());
}

}  // namespace mod::test
