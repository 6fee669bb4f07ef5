// Every string field of RunConfig, one row per field: what it holds decides what is checked
// before anything uses it (a NUL byte, the platform's path limits), so a bad value is an error
// naming the field and quoting the value short, not a raw library error later.
#pragma once

#include "configs/modtrain.pb.h"

namespace mod::config {

enum class StringKind {
  Path,   // a file system path: not empty, no NUL, at most PATH_MAX - 1 bytes, NAME_MAX a component
  Label,  // a name for logs and file names: no NUL or line break, at most kMaxLabelBytes
};

struct StringField {
  const char* field;  // path from RunConfig
  StringKind kind;
};

inline constexpr int kMaxLabelBytes = 256;

// One row per string field of the schema (tests/configs/config_test.cpp checks both ways).
inline constexpr StringField kStringFields[] = {
    {"name", StringKind::Label},
    {"data.dir", StringKind::Path},
};

// Throws std::invalid_argument "config: <field>: ..." for the first bad string; a field without
// a row is a logic_error (the table is out of date).
void check_string_fields(const modtrain::RunConfig& cfg);

}  // namespace mod::config
