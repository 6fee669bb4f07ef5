// The grid's plots, drawn by gnuplot (Debian's gnuplot-nox) from the collected results:
//   isoflop.png                   final validation loss vs parameters (log x), one curve per
//                                 (budget, variant); colour by budget, dense solid, MoD dashed;
//                                 each curve's minimum circled (the isoFLOP-optimal size);
//                                 with extra seeds, each point the mean over its seeds and
//                                 an error bar spanning them;
//   loss_vs_flops_per_token.png   the same losses vs forward FLOPs per token (log x).
// The data and gnuplot scripts stay in OUT/plots/ (re-run `gnuplot OUT/plots/isoflop.gp` after
// editing). Without gnuplot, or without a finished point, nothing is drawn and the report says
// why; that is never an error.
#pragma once

#include <string>
#include <vector>

#include "configs/grid.pb.h"
#include "grid/results.h"

namespace mod::grid {

struct PlotReport {
  std::vector<std::string> drawn;      // paths of the PNGs written
  std::vector<std::string> not_drawn;  // "isoflop.png: <why>"
};

PlotReport draw_plots(const modtrain::GridSpec& spec, const std::vector<PointResult>& results,
                      const std::string& out_dir);

}  // namespace mod::grid
