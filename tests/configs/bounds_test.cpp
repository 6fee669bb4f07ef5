// The bounds every RunConfig passes: model sizes and the parameter count (configs/model_size.h),
// a range for every float field (configs/float_ranges.h) and a kind for every string field
// (configs/string_fields.h). Errors name the field, the value
// and the bound; the same checks run for a config file, --set and a config inside another file.
#include <catch2/catch.hpp>

#include <google/protobuf/descriptor.h>

#include <functional>
#include <set>

#include "configs/config.h"
#include "configs/float_ranges.h"
#include "configs/model_size.h"
#include "configs/string_fields.h"
#include "tests/support/errors.h"

using namespace mod;
using Catch::Matchers::Contains;

using mod::test::error_of;
using mod::test::write_bytes;

namespace {
const std::string kRecipe = MOD_SOURCE_DIR "/configs/recipes/tiny_mod.textproto";

std::string set_error(const std::vector<std::string>& sets) {
  return error_of([&] { config::load(kRecipe, sets); });
}

// Every float or double field's path from RunConfig.
void float_paths(const google::protobuf::Descriptor* d, const std::string& path,
                 std::set<std::string>& out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const auto* f = d->field(i);
    const std::string here = path.empty() ? f->name() : path + "." + f->name();
    if (f->message_type()) float_paths(f->message_type(), here, out);
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE ||
        f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_FLOAT)
      out.insert(here);
  }
}
}  // namespace

TEST_CASE("model sizes above their ceiling are refused naming the field", "[config][errors]") {
  const std::string big = "2147483647";  // what 2^31 becomes in an int32 field
  CHECK_THAT(set_error({"model.n_layers=" + big}), Contains("model.n_layers") && Contains("at most 1024"));
  CHECK_THAT(set_error({"model.seq_len=" + big}), Contains("model.seq_len") && Contains("at most"));
  CHECK_THAT(set_error({"model.vocab_size=" + big}), Contains("model.vocab_size"));
  CHECK_THAT(set_error({"model.d_ff=" + big}), Contains("model.d_ff"));
  CHECK_THAT(set_error({"model.d_model=131072", "model.n_heads=2"}), Contains("model.d_model"));
  CHECK_THAT(set_error({"model.mod.causal.predictor_hidden=" + big}),
             Contains("model.mod.causal.predictor_hidden"));
  CHECK_THAT(set_error({"model.moe.enabled=true", "model.moe.n_experts=" + big}),
             Contains("model.moe.n_experts"));
  CHECK_THAT(set_error({"model.moe.enabled=true", "model.moe.d_expert=" + big}),
             Contains("model.moe.d_expert"));
  // Each size within its ceiling, the whole model past 2^40 parameters.
  CHECK_THAT(set_error({"model.d_model=65536", "model.n_layers=1024", "model.d_ff=262144"}),
             Contains("parameters exceed the bound") && Contains("model.n_layers"));
  // Real large models pass (GPT-3 175B's shape; nothing is allocated by a check).
  CHECK(set_error({"model.d_model=12288", "model.n_layers=96", "model.n_heads=96",
                   "model.d_ff=49152", "model.vocab_size=50257", "model.seq_len=2048"}) ==
        "no error");
  CHECK(set_error({"model.n_layers=1024"}) == "no error");
  // The same bound for a config arriving inside another file.
  modtrain::RunConfig inside = config::load(kRecipe, {});
  inside.mutable_model()->set_n_layers(1 << 30);
  CHECK_THAT(error_of([&] { config::parse_checked(config::to_text(inside), "w.safetensors"); }),
             Contains("config w.safetensors") && Contains("model.n_layers"));
}

TEST_CASE("the parameter bound is computed without overflow at the ceilings", "[config]") {
  modtrain::ModelConfig m;
  m.set_vocab_size(config::kMaxVocab);
  m.set_d_model(config::kMaxWidth);
  m.set_n_layers(config::kMaxLayers);
  m.set_d_ff(config::kMaxHidden);
  m.set_tie_embeddings(false);
  m.set_mlp(modtrain::ModelConfig::SWIGLU);
  m.mutable_moe()->set_enabled(true);
  m.mutable_moe()->set_n_experts(config::kMaxExperts);
  m.mutable_moe()->set_noop_expert(true);
  m.mutable_moe()->set_router_bias(true);
  m.mutable_mod()->mutable_router()->set_bias(true);
  m.mutable_mod()->set_enabled(true);
  m.mutable_mod()->mutable_causal()->set_predictor_hidden(config::kMaxWidth);
  const double d = config::kMaxWidth, expect = 1024.0 * (4 * d * d + 2 * d + 4096.0 * 3 * d * (1 << 20) +
                                                         4097.0 * d + 4097 + d + 1 + d * d + 2 * d + 1) +
                        d + 2.0 * (1 << 24) * d;
  CHECK(static_cast<double>(config::parameter_upper_bound(m)) == Approx(expect));
  CHECK_THROWS_WITH(config::check_model_size(m), Contains("parameters exceed"));
}

// Every string field's path from RunConfig.
void string_paths(const google::protobuf::Descriptor* d, const std::string& path,
                  std::set<std::string>& out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const auto* f = d->field(i);
    const std::string here = path.empty() ? f->name() : path + "." + f->name();
    if (f->message_type()) string_paths(f->message_type(), here, out);
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING) out.insert(here);
  }
}

TEST_CASE("every string field of the schema has exactly one row", "[config]") {
  std::set<std::string> fields, rows;
  string_paths(modtrain::RunConfig::descriptor(), "", fields);
  for (const auto& r : config::kStringFields) {
    INFO(r.field);
    CHECK(rows.insert(r.field).second);
  }
  CHECK(rows == fields);
}

// A NUL byte in data.dir used to end the path in a bare "error: data ab"; an over-long one
// surfaced as std::filesystem's "File name too long" without the field.
TEST_CASE("string fields with a NUL byte or past the path limits are refused naming the field",
          "[config][errors]") {
  auto text_error = [](const std::string& text) {
    return error_of([&] { config::validate(config::parse_text(text, "t.textproto")); });
  };
  CHECK_THAT(text_error("data { dir: \"ab\\000c\" }"),
             Contains("data.dir: \"ab\\x00c\"") && Contains("NUL byte at offset 2"));
  CHECK_THAT(set_error({"data.dir=" + std::string(5000, 'a')}),
             Contains("data.dir") && Contains("(5000 bytes)") && Contains("PATH_MAX"));
  CHECK_THAT(set_error({"data.dir=/tmp/" + std::string(300, 'b') + "/x"}),
             Contains("data.dir") && Contains("component of 300 bytes") && Contains("NAME_MAX"));
  CHECK_THAT(set_error({"data.dir="}), Contains("data.dir") && Contains("is empty"));
  CHECK_THAT(text_error("name: \"two\\nlines\""), Contains("name") && Contains("line break"));
  CHECK_THAT(set_error({"name=" + std::string(300, 'n')}),
             Contains("name") && Contains("longer than 256 bytes"));
  CHECK(set_error({"data.dir=/tmp/" + std::string(255, 'c'), "name=" + std::string(256, 'n')}) ==
        "no error");
}

TEST_CASE("every float field of the schema has exactly one range row", "[config]") {
  std::set<std::string> fields, rows;
  float_paths(modtrain::RunConfig::descriptor(), "", fields);
  for (const auto& r : config::kFloatRanges) {
    INFO(r.field);
    CHECK(rows.insert(r.field).second);  // no field twice
    CHECK(r.lo < r.hi);
  }
  CHECK(rows == fields);
}

TEST_CASE("float fields outside their range are refused naming field, value and range",
          "[config][errors]") {
  // The values issue 43 found reaching `topk: scores row 0 position 0 is NaN`.
  CHECK_THAT(set_error({"optimizer.lr=1e308"}), Contains("optimizer.lr: 1e+308") && Contains("(0, 10]"));
  CHECK_THAT(set_error({"optimizer.weight_decay=1e308"}),
             Contains("optimizer.weight_decay: 1e+308") && Contains("[0, 10]"));
  CHECK_THAT(set_error({"model.init_std=1e308"}), Contains("model.init_std: 1e+308") && Contains("(0, 1]"));
  CHECK_THAT(error_of([] { config::validate(config::parse_text("model { rope_theta: 1e-320 }", "t")); }),
             Contains("model.rope_theta: 9.99989e-321") && Contains("[1, 1e+12]"));
  // Each row: just outside is refused, its bounds (when closed) pass. MoE rows apply with MoE on.
  for (const auto& r : config::kFloatRanges) {
    INFO(r.field);
    const std::string f = r.field;
    std::vector<std::string> base = {"model.moe.enabled=true", "model.moe.n_experts=4096"};
    if (f == "model.moe.noop_capacity") base.push_back("model.moe.noop_expert=true");
    if (f == "optimizer.min_lr" || f == "optimizer.lr") base.push_back("optimizer.min_lr=0");
    if (f == "optimizer.weight_decay") base.push_back("optimizer.lr=0.1");
    auto with = [&](double v) {
      auto sets = base;
      char s[64];
      std::snprintf(s, sizeof s, "%.17g", v);
      sets.push_back(f + "=" + s);
      return set_error(sets);
    };
    const double above = r.hi_open ? r.hi : r.hi * 2, below = r.lo_open ? r.lo : r.lo - 1;
    CHECK_THAT(with(above), Contains(f));
    CHECK_THAT(with(below), Contains(f));
    const bool joined = f == "optimizer.min_lr" || f == "model.moe.capacity_factor";  // own text
    if (!joined) CHECK_THAT(with(above), Contains(config::range_text(r)));
    if (!r.hi_open && f != "optimizer.min_lr") CHECK(with(r.hi) == "no error");
    if (!r.lo_open) CHECK(with(r.lo) == "no error");
  }
  // A bound that joins two fields: decay scales each weight by 1 - lr * weight_decay.
  CHECK_THAT(set_error({"optimizer.lr=1", "optimizer.min_lr=0", "optimizer.weight_decay=2"}),
             Contains("optimizer.weight_decay") && Contains("at most 1"));
  // MoE's ranges wait until MoE is on; NaN is refused anywhere.
  CHECK(set_error({"model.moe.z_weight=5000"}) == "no error");
  CHECK_THAT(set_error({"model.moe.z_weight=nan"}), Contains("model.moe.z_weight"));
}
