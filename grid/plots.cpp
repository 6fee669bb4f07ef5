// gnuplot scripts and data for the grid's plots (see plots.h).
#include "grid/plots.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "core/util/find_on_path.h"
#include "core/util/gnuplot.h"

namespace mod::grid {

namespace fs = std::filesystem;

namespace {

constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                    "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
constexpr int kPointTypes[] = {7, 5, 9, 11, 13, 15};  // filled circle, square, triangles, ...

// One (budget, variant) curve of top-C losses, or, for a routed variant, of causal ones; each
// point the mean over its seeds, with their range as an error bar.
struct Curve {
  int budget_index = 0, variant_index = 0;
  std::string title;
  bool routed = false, causal = false;
  bool has_spread = false;  // some point has more than one seed
  std::vector<const SeedGroup*> points;  // with this curve's loss
  const std::vector<double>& losses(const SeedGroup* g) const {
    return causal ? g->causal_losses : g->losses;
  }
  double loss(const SeedGroup* g) const { return causal ? *g->causal_mean() : g->mean(); }
  double low(const SeedGroup* g) const { return *std::ranges::min_element(losses(g)); }
  double high(const SeedGroup* g) const { return *std::ranges::max_element(losses(g)); }
};

// Writes the data file (one block per curve, then one block holding each curve's minimum) and
// the script; returns the script's path.
std::string write_plot(const modtrain::GridSpec& spec, const std::vector<Curve>& curves,
                       const std::string& plots_dir, const std::string& png, const std::string& stem,
                       bool by_parameters) {
  const std::string dat = plots_dir + "/" + stem + ".dat", gp = plots_dir + "/" + stem + ".gp";
  auto x_of = [&](const SeedGroup* r) {
    return by_parameters ? static_cast<double>(r->point->flops.parameters) : r->point->flops.forward_per_token;
  };
  {
    std::ofstream d(dat);
    d << "# " << (by_parameters ? "parameters" : "forward_flops_per_token")
      << " final_val_loss shape point lowest highest (loss: the mean over seeds, lowest and "
         "highest: their range); one block per curve, then each curve's minimum\n";
    for (const Curve& c : curves) {
      std::vector<const SeedGroup*> pts = c.points;
      std::sort(pts.begin(), pts.end(), [&](auto* a, auto* b) { return x_of(a) < x_of(b); });
      d << "# " << c.title << "\n";
      for (const auto* r : pts)
        d << x_of(r) << " " << c.loss(r) << " " << r->point->shape << " " << r->point->name << " "
          << c.low(r) << " " << c.high(r) << "\n";
      d << "\n\n";
    }
    for (const Curve& c : curves) {
      const auto* best = *std::min_element(c.points.begin(), c.points.end(),
                                           [&](auto* a, auto* b) { return c.loss(a) < c.loss(b); });
      d << "# minimum of " << c.title << "\n"
        << x_of(best) << " " << c.loss(best) << " " << best->point->shape << " " << best->point->name
        << "\n\n\n";
    }
  }
  const bool seeded = std::ranges::any_of(curves, [](const Curve& c) { return c.has_spread; });
  std::ofstream g(gp);
  g << "# " << stem << ".png of grid " << spec.name() << ", written by `modtrain grid collect`.\n"
    << util::gnuplot_png_output(png, 1100, 720)
    // Two lines: one would run past the plot's left edge (the key takes the right).
    << "set title "
    << (by_parameters
            ? util::gnuplot_quote("isoFLOP curves of grid " + spec.name()) + ".\"\\n\"." +
                  util::gnuplot_quote(std::string("dense solid, MoD top-C dashed, MoD causal "
                                                  "dotted; circles: minima") +
                                      (seeded ? "; bars: range over seeds" : ""))
            : util::gnuplot_quote("grid " + spec.name() +
                                  ": final validation loss vs forward FLOPs per token"))
    << "\n"
    << "set xlabel " << util::gnuplot_quote(by_parameters ? "parameters" : "forward FLOPs per token") << "\n"
    << "set ylabel 'final validation loss'\n"
    << "set logscale x\nset format x '%.1s%c'\nset grid\nset key outside right top\n"
    << "set offsets graph 0.05, graph 0.05, graph 0.05, graph 0.05\n";
  g << "plot \\\n";
  const int n = static_cast<int>(curves.size());
  for (int i = 0; i < n; ++i) {
    const Curve& c = curves[i];
    const char* colour = kColours[c.budget_index % std::size(kColours)];
    const int pt = kPointTypes[c.variant_index % std::size(kPointTypes)];
    g << "  " << util::gnuplot_quote(dat) << " index " << i << " using 1:2 with linespoints lw 2 ps 1.3 lc rgb '"
      << colour << "' dt " << (c.causal ? 3 : c.routed ? 2 : 1) << " pt " << pt << " title " << util::gnuplot_quote(c.title)
      << ", \\\n";
    if (c.has_spread)  // the seeds' range
      g << "  " << util::gnuplot_quote(dat) << " index " << i << " using 1:2:5:6 with yerrorbars lw 1.5 ps 0 lc rgb '"
        << colour << "' notitle, \\\n";
    if (c.variant_index == 0 && !c.causal)  // shape names, once per budget
      g << "  " << util::gnuplot_quote(dat) << " index " << i << " using 1:2:3 with labels offset char 0,1 tc rgb '"
        << colour << "' notitle, \\\n";
  }
  for (int i = 0; i < n; ++i) {
    const char* colour = kColours[curves[i].budget_index % std::size(kColours)];
    g << "  " << util::gnuplot_quote(dat) << " index " << n + i
      << " using 1:2 with points pt 6 ps 3.2 lw 2 lc rgb '" << colour << "' "
      << (i == 0 ? "title 'minimum of each curve'" : "notitle") << (i + 1 < n ? ", \\\n" : "\n");
  }
  return gp;
}

}  // namespace

PlotReport draw_plots(const modtrain::GridSpec& spec, const std::vector<PointResult>& results,
                      const std::string& out_dir) {
  PlotReport report;
  const std::string names[2] = {"isoflop", "loss_vs_flops_per_token"};
  std::map<std::tuple<int, int, bool>, Curve> by_key;  // (budget, variant, causal), spec order
  const std::vector<SeedGroup> groups = group_by_seed(results);
  auto add = [&](const SeedGroup& r, bool causal) {
    const GridPoint& p = *r.point;
    Curve& c = by_key[{p.budget_index, p.variant_index, causal}];
    c.budget_index = p.budget_index;
    c.variant_index = p.variant_index;
    c.routed = p.routed;
    c.causal = causal;
    c.title = p.budget_label + " FLOPs, " + p.variant +
              (!p.routed ? "" : causal ? " (causal routing)" : " (top-C routing)");
    c.points.push_back(&r);
    c.has_spread = c.has_spread || (causal ? r.causal_losses : r.losses).size() > 1;
  };
  for (const auto& r : groups) {
    add(r, false);
    if (r.causal_mean() && r.point->routed) add(r, true);
  }
  auto fail_all = [&](const std::string& why) {
    for (const auto& n : names) report.not_drawn.push_back(n + ".png: " + why);
    return report;
  };
  if (by_key.empty()) return fail_all("no finished point has a validation loss yet");
  std::vector<Curve> curves;
  for (auto& [key, c] : by_key) curves.push_back(std::move(c));
  const std::string plots_dir = out_dir + "/plots";
  fs::create_directories(plots_dir);
  const std::string gnuplot = util::find_on_path("gnuplot");
  for (int i = 0; i < 2; ++i) {
    const std::string png = out_dir + "/" + names[i] + ".png";
    const std::string gp = write_plot(spec, curves, plots_dir, png, names[i], i == 0);
    if (gnuplot.empty()) {
      report.not_drawn.push_back(names[i] + ".png: gnuplot is not on PATH (install Debian's "
                                 "gnuplot-nox, then run `gnuplot " + gp + "` or collect again)");
      continue;
    }
    const std::string error = util::run_gnuplot(gnuplot, gp, png);
    if (error.empty())
      report.drawn.push_back(png);
    else
      report.not_drawn.push_back(names[i] + ".png: " + error);
  }
  return report;
}

}  // namespace mod::grid
