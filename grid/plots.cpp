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

namespace mod::grid {

namespace fs = std::filesystem;

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate)) return candidate;
  }
  return "";
}

namespace {

constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                    "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
constexpr int kPointTypes[] = {7, 5, 9, 11, 13, 15};  // filled circle, square, triangles, ...

std::string gp_quote(const std::string& s) {  // a gnuplot single-quoted string
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

struct Curve {
  int budget_index = 0, variant_index = 0;
  std::string title;
  bool routed = false;
  std::vector<const PointResult*> points;  // finished, with a loss
};

// Writes the data file (one block per curve, then one block holding each curve's minimum) and
// the script; returns the script's path.
std::string write_plot(const modtrain::GridSpec& spec, const std::vector<Curve>& curves,
                       const std::string& plots_dir, const std::string& png, const std::string& stem,
                       bool by_parameters) {
  const std::string dat = plots_dir + "/" + stem + ".dat", gp = plots_dir + "/" + stem + ".gp";
  auto x_of = [&](const PointResult* r) {
    return by_parameters ? static_cast<double>(r->point->flops.parameters) : r->point->flops.forward_per_token;
  };
  {
    std::ofstream d(dat);
    d << "# " << (by_parameters ? "parameters" : "forward_flops_per_token")
      << " final_val_loss shape point; one block per curve, then each curve's minimum\n";
    for (const Curve& c : curves) {
      std::vector<const PointResult*> pts = c.points;
      std::sort(pts.begin(), pts.end(), [&](auto* a, auto* b) { return x_of(a) < x_of(b); });
      d << "# " << c.title << "\n";
      for (const auto* r : pts)
        d << x_of(r) << " " << *r->val_loss << " " << r->point->shape << " " << r->point->name << "\n";
      d << "\n\n";
    }
    for (const Curve& c : curves) {
      const auto* best = *std::min_element(c.points.begin(), c.points.end(),
                                           [](auto* a, auto* b) { return *a->val_loss < *b->val_loss; });
      d << "# minimum of " << c.title << "\n"
        << x_of(best) << " " << *best->val_loss << " " << best->point->shape << " " << best->point->name
        << "\n\n\n";
    }
  }
  std::ofstream g(gp);
  g << "# " << stem << ".png of grid " << spec.name() << ", written by `modtrain grid collect`.\n"
    << "if (strstrt(' '.GPVAL_TERMINALS.' ', ' pngcairo ') > 0) {\n"
    << "  set terminal pngcairo size 1100,720 noenhanced font 'sans,11'\n"
    << "} else {\n"
    << "  set terminal png size 1100,720 noenhanced\n"
    << "}\n"
    << "set output " << gp_quote(png) << "\n"
    << "set title " << gp_quote(by_parameters ? "isoFLOP curves of grid " + spec.name() +
                                                   " (dense solid, MoD dashed; circles: minimum of each curve)"
                                             : "grid " + spec.name() +
                                                   ": final validation loss vs forward FLOPs per token")
    << "\n"
    << "set xlabel " << gp_quote(by_parameters ? "parameters" : "forward FLOPs per token") << "\n"
    << "set ylabel 'final validation loss'\n"
    << "set logscale x\nset format x '%.1s%c'\nset grid\nset key outside right top\n"
    << "set offsets graph 0.05, graph 0.05, graph 0.05, graph 0.05\n";
  g << "plot \\\n";
  const int n = static_cast<int>(curves.size());
  for (int i = 0; i < n; ++i) {
    const Curve& c = curves[i];
    const char* colour = kColours[c.budget_index % std::size(kColours)];
    const int pt = kPointTypes[c.variant_index % std::size(kPointTypes)];
    g << "  " << gp_quote(dat) << " index " << i << " using 1:2 with linespoints lw 2 ps 1.3 lc rgb '"
      << colour << "' dt " << (c.routed ? 2 : 1) << " pt " << pt << " title " << gp_quote(c.title)
      << ", \\\n";
    if (c.variant_index == 0)  // shape names, once per budget
      g << "  " << gp_quote(dat) << " index " << i << " using 1:2:3 with labels offset char 0,1 tc rgb '"
        << colour << "' notitle, \\\n";
  }
  for (int i = 0; i < n; ++i) {
    const char* colour = kColours[curves[i].budget_index % std::size(kColours)];
    g << "  " << gp_quote(dat) << " index " << n + i
      << " using 1:2 with points pt 6 ps 3.2 lw 2 lc rgb '" << colour << "' "
      << (i == 0 ? "title 'minimum of each curve'" : "notitle") << (i + 1 < n ? ", \\\n" : "\n");
  }
  return gp;
}

// Runs gnuplot on a script; "" on success, else what went wrong.
std::string run_gnuplot(const std::string& gnuplot, const std::string& script, const std::string& png) {
  std::error_code ec;
  fs::remove(png, ec);
  const std::string cmd = "'" + gnuplot + "' '" + script + "' 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "cannot start " + gnuplot;
  std::string output;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) output.append(buf, got);
  const int status = pclose(p);
  unsigned char magic[8] = {};
  std::ifstream f(png, std::ios::binary);
  f.read(reinterpret_cast<char*>(magic), 8);
  const unsigned char png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (status != 0 || !std::equal(magic, magic + 8, png_magic)) {
    while (!output.empty() && output.back() == '\n') output.pop_back();
    return "gnuplot " + script + " failed (status " + std::to_string(status) + "): " + output;
  }
  return "";
}

}  // namespace

PlotReport draw_plots(const modtrain::GridSpec& spec, const std::vector<PointResult>& results,
                      const std::string& out_dir) {
  PlotReport report;
  const std::string names[2] = {"isoflop", "loss_vs_flops_per_token"};
  std::map<std::pair<int, int>, Curve> by_key;  // (budget, variant) in spec order
  for (const auto& r : results) {
    if (!r.val_loss) continue;
    const GridPoint& p = *r.point;
    Curve& c = by_key[{p.budget_index, p.variant_index}];
    c.budget_index = p.budget_index;
    c.variant_index = p.variant_index;
    c.routed = p.routed;
    c.title = p.budget_label + " FLOPs, " + p.variant;
    c.points.push_back(&r);
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
  const std::string gnuplot = find_on_path("gnuplot");
  for (int i = 0; i < 2; ++i) {
    const std::string png = out_dir + "/" + names[i] + ".png";
    const std::string gp = write_plot(spec, curves, plots_dir, png, names[i], i == 0);
    if (gnuplot.empty()) {
      report.not_drawn.push_back(names[i] + ".png: gnuplot is not on PATH (install Debian's "
                                 "gnuplot-nox, then run `gnuplot " + gp + "` or collect again)");
      continue;
    }
    const std::string error = run_gnuplot(gnuplot, gp, png);
    if (error.empty())
      report.drawn.push_back(png);
    else
      report.not_drawn.push_back(names[i] + ".png: " + error);
  }
  return report;
}

}  // namespace mod::grid
