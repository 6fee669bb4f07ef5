// JSON nesting-depth guard (see json_nesting.h).
#include "core/util/json_nesting.h"

#include <stdexcept>

namespace mod {

void check_json_nesting(std::string_view json, int max_depth, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        throw std::runtime_error(what + " nests deeper than " + std::to_string(max_depth) +
                                 " levels (at byte " + std::to_string(i) + ")");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

}  // namespace mod
