// gnuplot as a separate program (see gnuplot.h).
#include "core/util/gnuplot.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace mod::util {

namespace fs = std::filesystem;

std::string gnuplot_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string gnuplot_png_output(const std::string& png, int width, int height) {
  const std::string size = std::to_string(width) + "," + std::to_string(height);
  return "if (strstrt(' '.GPVAL_TERMINALS.' ', ' pngcairo ') > 0) {\n"
         "  set terminal pngcairo size " +
         size +
         " noenhanced font 'sans,11'\n"
         "} else {\n"
         "  set terminal png size " +
         size +
         " noenhanced\n"
         "}\n"
         "set output " +
         gnuplot_quote(png) + "\n";
}

std::string run_gnuplot(const std::string& gnuplot, const std::string& script,
                        const std::string& png) {
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

}  // namespace mod::util
