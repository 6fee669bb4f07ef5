// Float field ranges (see float_ranges.h), checked by reflection so a new field without a row
// is caught.
#include "configs/float_ranges.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "configs/field_walk.h"

namespace mod::config {

namespace {
namespace pb = google::protobuf;

std::string number(double v) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", v);
  return s;
}

const FloatRange& row_of(const std::string& field) {
  for (const FloatRange& r : kFloatRanges)
    if (field == r.field) return r;
  throw std::logic_error("config: " + field + ": no row in kFloatRanges (configs/float_ranges.h)");
}

void check_value(const std::string& at, const FloatRange& r, double v, bool in_use) {
  const bool above_lo = r.lo_open ? v > r.lo : v >= r.lo;
  const bool below_hi = r.hi_open ? v < r.hi : v <= r.hi;
  if (!std::isfinite(v) || (in_use && !(above_lo && below_hi))) {
    const std::string sign = r.lo == 0 ? (r.lo_open ? "positive, " : ">= 0, ") : "";
    throw std::invalid_argument("config: " + at + ": " + number(v) + " must be " + sign + "in " +
                                range_text(r));
  }
}

}  // namespace

std::string range_text(const FloatRange& r) {
  return (r.lo_open ? "(" : "[") + number(r.lo) + ", " + number(r.hi) + (r.hi_open ? ")" : "]");
}

void check_float_ranges(const modtrain::RunConfig& cfg) {
  const bool moe_on = cfg.model().moe().enabled();
  for_each_scalar_field(cfg, [&](const pb::Message& msg, const pb::FieldDescriptor* f,
                                 const std::string& here) {
    const bool is_double = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_DOUBLE;
    if (!is_double && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_FLOAT) return;
    const FloatRange& r = row_of(here);
    const bool in_use = moe_on || here.rfind("model.moe.", 0) != 0;  // ranges wait for MoE
    const pb::Reflection* refl = msg.GetReflection();
    if (!f->is_repeated())
      return check_value(here, r, is_double ? refl->GetDouble(msg, f) : refl->GetFloat(msg, f),
                         in_use);
    for (int k = 0; k < refl->FieldSize(msg, f); ++k)
      check_value(here + "[" + std::to_string(k) + "]", r,
                  is_double ? refl->GetRepeatedDouble(msg, f, k) : refl->GetRepeatedFloat(msg, f, k),
                  in_use);
  });
}

}  // namespace mod::config
