// parallel_bench's theory side: the layouts it measures and the minimum bytes each rank must
// send per step for a config and layout (ring all-reduce 2(n-1)/n x S, all-gather (n-1)/n x S),
// with the formula spelled out for the printout. docs/parallel.md explains each term.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "configs/modtrain.pb.h"

namespace mod::bench {

struct Layout {
  int dp = 1, tp = 1;
  bool zero1 = false;
  std::string label() const;  // "dp2", "tp2", "dp2xtp2", "dp2+zero1"
};
// "dp2", "tp2", "dp2xtp2", "dp2+zero1"; anything else is an error quoting the text.
Layout parse_layout(const std::string& text);
// What fits n ranks: 1 -> dp1; 2 -> dp2, tp2, dp2+zero1; 4 -> dp2xtp2, dp4, tp4.
std::vector<Layout> default_layouts(int n);

struct Napkin {
  int64_t params = 0, split = 0, replicated = 0;
  double local = 0;  // P_local
  double dp_bytes = 0, tp_bytes = 0;
  std::string params_formula, dp_formula, tp_formula;
};
Napkin napkin(const modtrain::RunConfig& cfg, const Layout& l);

// printf into a string (up to 6 numbers).
std::string fmt(const char* format, double a = 0, double b = 0, double c = 0, double d = 0,
                double e = 0, double f = 0);

}  // namespace mod::bench
