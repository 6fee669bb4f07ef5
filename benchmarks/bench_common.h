// Small helpers every benchmark shares: the clock, the machine's load, and recipe paths that
// work from any directory. Header-only; MOD_SOURCE_DIR comes from benchmarks/CMakeLists.txt.
#pragma once

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace mod::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The 1-minute load average: above ~1 on a 2-core machine something else runs, and timings
// (not bytes or FLOPs) are unreliable.
inline double load_average() {
  double load[1] = {-1};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

// A recipe path as given, else relative to the source tree (runs from any directory).
inline std::string resolve(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::exists(path) || fs::path(path).is_absolute()) return path;
  const std::string in_source = std::string(MOD_SOURCE_DIR) + "/" + path;
  return fs::exists(in_source) ? in_source : path;
}

}  // namespace mod::bench
