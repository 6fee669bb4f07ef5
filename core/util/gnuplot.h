// Drawing PNGs with gnuplot (Debian's gnuplot-nox), shared by the grid's plots and
// `modtrain inspect`: a script is written next to its data and run as a separate program, so a
// user can edit and re-run it; without gnuplot nothing is drawn and the caller says why.
#pragma once

#include <string>

namespace mod::util {

// s as a gnuplot single-quoted string.
std::string gnuplot_quote(const std::string& s);

// Script lines that select a PNG terminal of the given size (pngcairo where gnuplot has it,
// else png) and write to `png`.
std::string gnuplot_png_output(const std::string& png, int width, int height);

// Runs gnuplot (a path from find_on_path, core/util/find_on_path.h) on a script that writes `png`;
// "" on success, else what went wrong (gnuplot's own output included). A missing or non-PNG output
// is a failure.
std::string run_gnuplot(const std::string& gnuplot, const std::string& script,
                        const std::string& png);

}  // namespace mod::util
