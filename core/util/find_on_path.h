// Finding a program as a shell would (gnuplot for plots, mpirun and sbatch for grids), so a
// missing one is reported by name instead of failing inside a child process.
#pragma once

#include <string>

namespace mod::util {

// The first executable `name` on PATH, or "".
std::string find_on_path(const std::string& name);

}  // namespace mod::util
