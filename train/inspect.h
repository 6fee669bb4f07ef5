// `modtrain inspect`: a routing trace (model/routing_trace.h) as files a person looks at:
//   routing.png   heat map, tokens along x, routed blocks along y, colour = router score;
//                 circles mark top-C picks (training), crosses causal admissions (sampling);
//   routing.html  self-contained page: the text once per routed block, each token coloured by
//                 its router score, top-C picks boxed, causal admissions underlined, numbers on
//                 hover;
//   routing.csv   one row per (block, token): scores, probabilities, both decisions.
// gnuplot's script and data stay beside the PNG (routing.gp), as for the grid's plots.
#pragma once

#include <string>
#include <vector>

#include "model/routing_trace.h"

namespace mod::train {

struct RoutingReport {
  std::string csv, html, png;  // paths written ("" for a PNG not drawn)
  std::string png_not_drawn;   // why, when png is ""
};

// pieces[i]: the text of token i (any bytes; invalid UTF-8 is shown as <0xNN>). Writes into
// out_dir (created); title heads the page and the plot.
RoutingReport write_routing_report(const model::RoutingTrace& trace,
                                   const std::vector<std::string>& pieces, const std::string& title,
                                   const std::string& out_dir);

// The terminal summary: per routed block, the agreement and the tokens each routing picks.
std::string describe_routing(const model::RoutingTrace& trace,
                             const std::vector<std::string>& pieces);

// piece with invalid UTF-8 bytes replaced by <0xNN> (what every output shows).
std::string printable_piece(const std::string& piece);

}  // namespace mod::train
