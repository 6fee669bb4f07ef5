// A nesting-depth guard for JSON text, run before a parser or a tree walk that recurses once per
// level: "[[[[..." a megabyte deep is refused by a flat scan, never a stack overflow or a
// recursion that copies a path string per level.
#pragma once

#include <string>
#include <string_view>

namespace mod {

// Throws std::runtime_error "<what> nests deeper than <max_depth> levels (at byte N)" when [ and
// { (outside strings) nest deeper than max_depth anywhere in json.
void check_json_nesting(std::string_view json, int max_depth, const std::string& what);

}  // namespace mod
