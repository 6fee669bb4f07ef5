// Loading an isoFLOP grid spec (configs/grid.proto): a text-format GridSpec, then validation.
// Every error names the spec file and the field path (e.g. "shapes[1].n_heads",
// "base.optimizer.lr", "variants[0].mod.capacity") and what was expected. Checks that depend on
// a combination (an EXPLICIT routed block beyond a small shape's depth) are left to expansion,
// which reports such points as skipped with the reason (grid/expand.h).
#pragma once

#include <cstddef>
#include <string>

#include "configs/grid.pb.h"

namespace mod::grid {

// Parses a text-format GridSpec; unknown fields and syntax errors name the file and line.
modtrain::GridSpec parse_grid_text(const std::string& text, const std::string& origin);

// Throws std::invalid_argument "grid spec <origin>: <field>: <what>" for the first invalid field.
void validate_grid(const modtrain::GridSpec& spec, const std::string& origin);

// parse + validate a spec file.
modtrain::GridSpec load_grid(const std::string& path);

// The longest shape, variant or grid name: point names and directories are built from them.
inline constexpr size_t kMaxGridLabelChars = 64;

// Whether a shape or variant label may be part of a point name: 1 to kMaxGridLabelChars of
// [A-Za-z0-9.-] ('_' separates the parts of a point name, so it splits back into its parts).
bool valid_grid_label(const std::string& label);

}  // namespace mod::grid
