// A bitwise comparison of two value lists that, failing, names the first differing element
// and its two values instead of printing both lists (a parameter's can be 10^5 numbers, and
// Catch formatting them for every failed check takes minutes).
#pragma once

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

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

// Two runs, bit for bit: every step's loss, and every named tensor's bytes (in the same order).
inline void check_runs_bitwise(const std::vector<double>& got_losses,
                               const std::vector<std::pair<std::string, Tensor>>& got_params,
                               const std::vector<double>& want_losses,
                               const std::vector<std::pair<std::string, Tensor>>& want_params) {
  REQUIRE(got_losses.size() == want_losses.size());
  for (size_t s = 0; s < got_losses.size(); ++s) {
    INFO("step " << s + 1 << ": " << got_losses[s] << " vs " << want_losses[s]);
    CHECK(got_losses[s] == want_losses[s]);
  }
  REQUIRE(got_params.size() == want_params.size());
  for (size_t i = 0; i < got_params.size(); ++i) {
    INFO("parameter " << got_params[i].first);
    const Tensor& a = got_params[i].second;
    const Tensor& b = want_params[i].second;
    REQUIRE(a.nbytes() == b.nbytes());
    CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
  }
}

}  // namespace mod::test
