// String field checks (see string_fields.h), found by reflection so a new field without a row
// is caught.
#include "configs/string_fields.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "configs/field_walk.h"

namespace mod::config {

namespace {
namespace pb = google::protobuf;

// The value quoted for a message: at most 40 bytes, control bytes escaped.
std::string quoted(const std::string& v) {
  std::string out = "\"";
  for (size_t i = 0; i < v.size() && i < 40; ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c >= 0x20 && c != 0x7f && c != '"' && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  return out + (v.size() > 40 ? "...\"" : "\"");
}

[[noreturn]] void bad(const std::string& field, const std::string& value, const std::string& why) {
  throw std::invalid_argument("config: " + field + ": " + quoted(value) + " (" +
                              std::to_string(value.size()) + " bytes) " + why);
}

void check_value(const std::string& field, StringKind kind, const std::string& v) {
  if (const size_t nul = v.find('\0'); nul != std::string::npos)
    bad(field, v, "holds a NUL byte at offset " + std::to_string(nul));
  if (kind == StringKind::Label) {
    if (v.find_first_of("\r\n") != std::string::npos) bad(field, v, "holds a line break");
    if (v.size() > static_cast<size_t>(kMaxLabelBytes))
      bad(field, v, "is longer than " + std::to_string(kMaxLabelBytes) + " bytes");
    return;
  }
  if (v.empty()) bad(field, v, "is empty; expected a path");
  if (v.size() > PATH_MAX - 1)
    bad(field, v, "is longer than a path may be here (" + std::to_string(PATH_MAX - 1) +
                      " bytes, PATH_MAX)");
  for (size_t begin = 0; begin < v.size();) {
    const size_t end = std::min(v.find('/', begin), v.size());
    if (end - begin > NAME_MAX)
      bad(field, v, "has a component of " + std::to_string(end - begin) +
                        " bytes, " + quoted(v.substr(begin, end - begin)) + "; a file name is at most " +
                        std::to_string(NAME_MAX) + " bytes here (NAME_MAX)");
    begin = end + 1;
  }
}

const StringField& row_of(const std::string& field) {
  for (const StringField& r : kStringFields)
    if (field == r.field) return r;
  throw std::logic_error("config: " + field +
                         ": no row in kStringFields (configs/string_fields.h)");
}

}  // namespace

void check_string_fields(const modtrain::RunConfig& cfg) {
  for_each_scalar_field(cfg, [](const pb::Message& msg, const pb::FieldDescriptor* f,
                                const std::string& here) {
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING) return;
    const StringField& r = row_of(here);
    const pb::Reflection* refl = msg.GetReflection();
    if (!f->is_repeated()) return check_value(here, r.kind, refl->GetString(msg, f));
    for (int k = 0; k < refl->FieldSize(msg, f); ++k)
      check_value(here + "[" + std::to_string(k) + "]", r.kind, refl->GetRepeatedString(msg, f, k));
  });
}

}  // namespace mod::config
