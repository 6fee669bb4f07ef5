// Routing reports: CSV, HTML and a gnuplot heat map (see inspect.h).
#include "train/inspect.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/util/find_on_path.h"
#include "core/util/gnuplot.h"

namespace mod::train {

namespace fs = std::filesystem;

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if there is none.
size_t utf8_length(const std::string& s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const size_t n = b < 0x80           ? 1
                   : (b >> 5) == 0x6  ? 2
                   : (b >> 4) == 0xe  ? 3
                   : (b >> 3) == 0x1e ? 4
                                      : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 0;
  return n;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  return out;
}

std::string csv_field(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string hex_byte(char c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", static_cast<unsigned>(static_cast<unsigned char>(c)));
  return buf;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// Blue (low) - white - red (high) over [lo, hi], as #rrggbb.
std::string score_colour(double v, double lo, double hi) {
  const double t = hi > lo ? std::clamp((v - lo) / (hi - lo), 0.0, 1.0) : 0.5;
  const double blue[3] = {59, 76, 192}, white[3] = {247, 247, 247}, red[3] = {180, 4, 38};
  const double* a = t < 0.5 ? blue : white;
  const double* b = t < 0.5 ? white : red;
  const double u = t < 0.5 ? t * 2 : (t - 0.5) * 2;
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(a[0] + (b[0] - a[0]) * u),
                static_cast<int>(a[1] + (b[1] - a[1]) * u),
                static_cast<int>(a[2] + (b[2] - a[2]) * u));
  return buf;
}

// A token's text on one line (tick labels, the terminal): control characters spelled out.
std::string one_line(const std::string& piece) {
  std::string out;
  for (char c : printable_piece(piece)) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20)
      out += hex_byte(c);
    else
      out += c;
  }
  return out;
}

int64_t count(const std::vector<bool>& v) {
  return std::count(v.begin(), v.end(), true);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw std::runtime_error("inspect: cannot write " + path);
}

std::string csv_report(const model::RoutingTrace& trace, const std::vector<std::string>& pieces) {
  std::ostringstream o;
  o << "block,position,token,text,router_score,decision_prob,top_c,causal\n";
  for (const auto& b : trace.blocks)
    for (size_t i = 0; i < trace.tokens.size(); ++i)
      o << b.block << "," << i << "," << trace.tokens[i] << ","
        << csv_field(printable_piece(pieces[i])) << "," << fmt("%.9g", b.router_score[i]) << ","
        << fmt("%.6f", b.decision_prob[i]) << "," << b.top_c[i] << "," << b.causal[i] << "\n";
  return o.str();
}

std::string html_report(const model::RoutingTrace& trace, const std::vector<std::string>& pieces,
                        const std::string& title) {
  std::ostringstream o;
  const size_t n = trace.tokens.size();
  o << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << html_escape(title)
    << "</title>\n<style>\n"
    << "body{font-family:sans-serif;max-width:72em;margin:2em auto;line-height:1.9}\n"
    << ".t{white-space:pre-wrap;padding:2px 0;border-radius:3px}\n"
    << ".c{outline:2px solid #222;outline-offset:-1px}\n"
    << ".a{text-decoration:underline 3px #222;text-underline-offset:4px}\n"
    << "h2{font-size:1.05em;margin-top:1.6em}\n</style></head><body>\n"
    << "<h1>" << html_escape(title) << "</h1>\n"
    << "<p>Each routed block's view of the same " << n << " tokens. Colour: the block's router "
    << "score (blue low, red high, scaled per block). <span class=\"t c\">Boxed</span>: chosen by "
    << "top-C routing (training; " << trace.capacity << " of " << n
    << " tokens, sees the whole sequence). <span class=\"t a\">Underlined</span>: admitted by "
       "causal "
    << "routing (sampling; decides from each token alone). Hover a token for its numbers.</p>\n";
  for (const auto& b : trace.blocks) {
    const auto [lo, hi] = std::minmax_element(b.router_score.begin(), b.router_score.end());
    o << "<h2>block " << b.block << ": top-C " << count(b.top_c) << ", causal " << count(b.causal)
      << ", agreement " << fmt("%.1f", 100 * b.agreement) << "%</h2>\n<div>";
    for (size_t i = 0; i < n; ++i) {
      o << "<span class=\"t" << (b.top_c[i] ? " c" : "") << (b.causal[i] ? " a" : "")
        << "\" style=\"background:" << score_colour(b.router_score[i], *lo, *hi) << "\" title=\"#"
        << i << " token " << trace.tokens[i] << ": r=" << fmt("%.4g", b.router_score[i])
        << ", p(enter)=" << fmt("%.3f", b.decision_prob[i]) << "\">"
        << html_escape(printable_piece(pieces[i])) << "</span>";
    }
    o << "</div>\n";
  }
  o << "</body></html>\n";
  return o.str();
}

// Writes routing.gp and its data; returns the script's path.
std::string heat_map_script(const model::RoutingTrace& trace,
                            const std::vector<std::string>& pieces, const std::string& title,
                            const std::string& dir, const std::string& png) {
  const size_t n = trace.tokens.size(), rows = trace.blocks.size();
  const std::string scores = dir + "/routing_scores.dat", marks = dir + "/routing_marks.dat";
  {
    std::ofstream d(scores);
    d << "# router score: one row per routed block (y), one column per token (x)\n";
    for (const auto& b : trace.blocks) {
      for (size_t i = 0; i < n; ++i) d << (i ? " " : "") << fmt("%.6g", b.router_score[i]);
      d << "\n";
    }
    std::ofstream m(marks);
    m << "# x y: index 0 top-C picks, index 1 causal admissions\n";
    for (int which = 0; which < 2; ++which) {
      for (size_t k = 0; k < rows; ++k)
        for (size_t i = 0; i < n; ++i)
          if (which == 0 ? trace.blocks[k].top_c[i] : trace.blocks[k].causal[i])
            m << i << " " << k << "\n";
      m << "\n\n";
    }
  }
  double extent = 1e-9;  // the largest |score|: a colour scale symmetric about 0
  for (const auto& b : trace.blocks)
    for (double v : b.router_score) extent = std::max(extent, std::abs(v));
  const int width = static_cast<int>(std::max<size_t>(900, 160 + 14 * n));
  const int height = static_cast<int>(260 + 70 * rows);
  std::ostringstream g;
  g << "# routing.png, written by `modtrain inspect`: re-run with `gnuplot routing.gp`.\n"
    << util::gnuplot_png_output(png, width, height) << "set title " << util::gnuplot_quote(title)
    << "\nset xrange [-0.5:" << n - 0.5 << "]\nset yrange [-0.5:" << rows - 0.5 << "]\n"
    << "set palette defined (0 '#3b4cc0', 0.5 '#f7f7f7', 1 '#b40426')\n"
    << "set cbrange [" << -extent << ":" << extent << "]\n"  // white at a score of 0
    << "set cblabel 'router score'\nset key outside bottom center horizontal\n"
    << "set xtics rotate by 90 right font ',8' (";
  for (size_t i = 0; i < n; ++i)
    g << (i ? ", " : "") << util::gnuplot_quote(one_line(pieces[i])) << " " << i;
  g << ")\nset ytics (";
  for (size_t k = 0; k < rows; ++k)
    g << (k ? ", " : "") << util::gnuplot_quote("block " + std::to_string(trace.blocks[k].block))
      << " " << k;
  g << ")\nplot " << util::gnuplot_quote(scores) << " matrix with image notitle, \\\n"
    << "  " << util::gnuplot_quote(marks) << " index 0 using 1:2 with points pt 6 ps 1.6 lw 1.5 "
    << "lc rgb '#111111' title 'top-C (training)', \\\n"
    << "  " << util::gnuplot_quote(marks) << " index 1 using 1:2 with points pt 2 ps 1.0 lw 1.5 "
    << "lc rgb '#111111' title 'causal (sampling)'\n";
  const std::string gp = dir + "/routing.gp";
  write_file(gp, g.str());
  return gp;
}

}  // namespace

std::string printable_piece(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    const size_t n = utf8_length(piece, i);
    if (n == 0) {
      out += hex_byte(piece[i]);
      ++i;
      continue;
    }
    out.append(piece, i, n);
    i += n;
  }
  return out;
}

RoutingReport write_routing_report(const model::RoutingTrace& trace,
                                   const std::vector<std::string>& pieces, const std::string& title,
                                   const std::string& out_dir) {
  if (pieces.size() != trace.tokens.size())
    throw std::invalid_argument("inspect: " + std::to_string(pieces.size()) + " token texts for " +
                                std::to_string(trace.tokens.size()) + " tokens");
  fs::create_directories(out_dir);
  RoutingReport r;
  r.csv = out_dir + "/routing.csv";
  write_file(r.csv, csv_report(trace, pieces));
  r.html = out_dir + "/routing.html";
  write_file(r.html, html_report(trace, pieces, title));
  const std::string png = out_dir + "/routing.png";
  const std::string gp = heat_map_script(trace, pieces, title, out_dir, png);
  const std::string gnuplot = util::find_on_path("gnuplot");
  if (gnuplot.empty()) {
    r.png_not_drawn =
        "gnuplot is not on PATH (install Debian's gnuplot-nox, then run `gnuplot " + gp + "`)";
    return r;
  }
  r.png_not_drawn = util::run_gnuplot(gnuplot, gp, png);
  if (r.png_not_drawn.empty()) r.png = png;
  return r;
}

std::string describe_routing(const model::RoutingTrace& trace,
                             const std::vector<std::string>& pieces) {
  std::ostringstream o;
  auto picked = [&](const std::vector<bool>& chosen) {
    std::string s;
    for (size_t i = 0; i < chosen.size(); ++i)
      if (chosen[i]) s += "[" + one_line(pieces[i]) + "]";
    return s;
  };
  o << trace.tokens.size() << " tokens, top-C capacity " << trace.capacity << "\n";
  for (const auto& b : trace.blocks)
    o << "block " << b.block << ": top-C " << count(b.top_c) << ", causal " << count(b.causal)
      << ", agreement " << fmt("%.1f", 100 * b.agreement) << "%\n"
      << "  top-C:  " << picked(b.top_c) << "\n"
      << "  causal: " << picked(b.causal) << "\n";
  return o.str();
}

}  // namespace mod::train
