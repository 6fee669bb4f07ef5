// PATH search (see find_on_path.h).
#include "core/util/find_on_path.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace mod::util {

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(candidate))
      return candidate;
  }
  return "";
}

}  // namespace mod::util
