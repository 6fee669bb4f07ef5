// RunConfig loading, overrides by reflection, and validation.
#include "configs/config.h"

#include "configs/float_ranges.h"
#include "configs/string_fields.h"
#include "configs/model_size.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

namespace mod::config {

namespace pb = google::protobuf;

namespace {

class ErrorCollector : public pb::io::ErrorCollector {
 public:
  explicit ErrorCollector(std::string origin) : origin_(std::move(origin)) {}
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty())
      first_ = origin_ + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " +
               message;
  }
  const std::string& first() const { return first_; }

 private:
  std::string origin_, first_;
};

[[noreturn]] void bad_field(const std::string& field, const std::string& what) {
  throw std::invalid_argument("config: " + field + ": " + what);
}

// parallel.pp and its schedule and layout (docs/parallel.md "Pipeline parallelism").
void validate_pipeline(const modtrain::RunConfig& cfg) {
  const auto& p = cfg.parallel();
  const int n = cfg.model().n_layers(), pp = p.pp(), v = p.virtual_stages();
  if (pp < 1) bad_field("parallel.pp", std::to_string(pp) + " must be >= 1");
  if (v < 1) bad_field("parallel.virtual_stages", std::to_string(v) + " must be >= 1");
  const bool interleaved = p.pp_schedule() == modtrain::ParallelConfig::INTERLEAVED_1F1B;
  if (interleaved != (v > 1))
    bad_field("parallel.virtual_stages",
              std::to_string(v) + (interleaved ? " must be >= 2 under parallel.pp_schedule "
                                                 "INTERLEAVED_1F1B (model chunks per rank)"
                                               : " must be 1 unless parallel.pp_schedule is "
                                                 "INTERLEAVED_1F1B"));
  if (interleaved && pp < 2)
    bad_field("parallel.pp_schedule", "INTERLEAVED_1F1B needs parallel.pp >= 2, got " + std::to_string(pp));
  if (interleaved && cfg.train().grad_accum() % pp != 0)
    bad_field("train.grad_accum", std::to_string(cfg.train().grad_accum()) +
                                      " (micro-batches) must be a multiple of parallel.pp " +
                                      std::to_string(pp) + " under INTERLEAVED_1F1B");
  const int stages = pp * v;
  if (stages > n)
    bad_field("parallel.pp", std::to_string(pp) + " x parallel.virtual_stages " + std::to_string(v) +
                                 " = " + std::to_string(stages) + " stages, more than model.n_layers " +
                                 std::to_string(n) + " (every stage needs a block)");
  if (p.pp_layout_size() == 0) return;
  if (p.pp_layout_size() != stages)
    bad_field("parallel.pp_layout", "has " + std::to_string(p.pp_layout_size()) +
                                        " entries, expected parallel.pp x parallel.virtual_stages = " +
                                        std::to_string(stages));
  int64_t sum = 0;
  for (int i = 0; i < stages; ++i) {
    if (p.pp_layout(i) < 1)
      bad_field("parallel.pp_layout[" + std::to_string(i) + "]",
                std::to_string(p.pp_layout(i)) + " must be >= 1 (every stage needs a block)");
    sum += p.pp_layout(i);
  }
  if (sum != n)
    bad_field("parallel.pp_layout", "sums to " + std::to_string(sum) + " blocks, expected model.n_layers " +
                                        std::to_string(n));
}

// model.moe: expert counts, capacities, and the combinations MoDE allows.
void validate_moe(const modtrain::ModelConfig& m) {
  const auto& e = m.moe();
  if (!e.enabled()) return;
  if (e.n_experts() < 1) bad_field("model.moe.n_experts", std::to_string(e.n_experts()) + " must be >= 1");
  if (e.d_expert() < 0) bad_field("model.moe.d_expert", std::to_string(e.d_expert()) + " must be >= 0 (0: model.d_ff)");
  if (!(e.capacity_factor() > 0) || e.capacity_factor() > e.n_experts())
    bad_field("model.moe.capacity_factor", std::to_string(e.capacity_factor()) +
                                               " must be in (0, model.moe.n_experts]");
  if (e.routing() == modtrain::MoEConfig::TOKEN_CHOICE && (e.top_k() < 1 || e.top_k() > 2 || e.top_k() > e.n_experts()))
    bad_field("model.moe.top_k", std::to_string(e.top_k()) + " must be 1 or 2 (and <= n_experts)");
  if (e.noop_expert() && e.routing() != modtrain::MoEConfig::EXPERT_CHOICE)
    bad_field("model.moe.noop_expert", "integrated MoDE needs routing EXPERT_CHOICE (one expert-choice router)");
  if (e.schedule() == modtrain::MoDConfig::EVERY_KTH && e.every_k() < 1)
    bad_field("model.moe.every_k", std::to_string(e.every_k()) + " must be >= 1");
  for (int i = 0; i < e.moe_blocks_size(); ++i)
    if (e.moe_blocks(i) < 0 || e.moe_blocks(i) >= m.n_layers())
      bad_field("model.moe.moe_blocks[" + std::to_string(i) + "]",
                std::to_string(e.moe_blocks(i)) + " is not a block in [0, " + std::to_string(m.n_layers()) + ")");
}

void set_scalar(pb::Message& msg, const pb::FieldDescriptor* f, const std::string& value,
                const std::string& path) {
  const pb::Reflection* r = msg.GetReflection();
  const bool rep = f->is_repeated();
  try {
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: {
        size_t used;
        const int v = std::stoi(value, &used);
        if (used != value.size()) throw std::invalid_argument(value);
        rep ? r->AddInt32(&msg, f, v) : r->SetInt32(&msg, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_INT64: {
        const int64_t v = std::stoll(value);
        rep ? r->AddInt64(&msg, f, v) : r->SetInt64(&msg, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_UINT32: {
        const uint32_t v = static_cast<uint32_t>(std::stoul(value));
        rep ? r->AddUInt32(&msg, f, v) : r->SetUInt32(&msg, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_UINT64: {
        const uint64_t v = std::stoull(value);
        rep ? r->AddUInt64(&msg, f, v) : r->SetUInt64(&msg, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
        size_t used;
        const double v = std::stod(value, &used);
        if (used != value.size()) throw std::invalid_argument(value);
        rep ? r->AddDouble(&msg, f, v) : r->SetDouble(&msg, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_FLOAT: {
        const float v = std::stof(value);
        rep ? r->AddFloat(&msg, f, v) : r->SetFloat(&msg, f, v);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_BOOL: {
        if (value != "true" && value != "false") throw std::invalid_argument(value);
        rep ? r->AddBool(&msg, f, value == "true") : r->SetBool(&msg, f, value == "true");
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_STRING:
        rep ? r->AddString(&msg, f, value) : r->SetString(&msg, f, value);
        return;
      case pb::FieldDescriptor::CPPTYPE_ENUM: {
        const pb::EnumValueDescriptor* e = f->enum_type()->FindValueByName(value);
        if (!e) {
          std::string names;
          for (int i = 0; i < f->enum_type()->value_count(); ++i)
            names += (i ? ", " : "") + f->enum_type()->value(i)->name();
          bad_field(path, "'" + value + "' is not one of " + names);
        }
        rep ? r->AddEnum(&msg, f, e) : r->SetEnum(&msg, f, e);
        return;
      }
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        bad_field(path, "is a message; set one of its fields (" + path + ".<field>=...)");
    }
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).rfind("config:", 0) == 0) throw;
    bad_field(path, "cannot parse '" + value + "' as " + f->cpp_type_name());
  } catch (const std::out_of_range&) {
    bad_field(path, "'" + value + "' is out of range for " + std::string(f->cpp_type_name()));
  }
}

std::vector<std::string> split_list(std::string v) {
  if (!v.empty() && v.front() == '[' && v.back() == ']') v = v.substr(1, v.size() - 2);
  std::vector<std::string> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

}  // namespace

void parse_text_message(const std::string& text, const std::string& origin, pb::Message& out,
                        const std::string& kind) {
  pb::TextFormat::Parser parser;
  ErrorCollector errors(origin);
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &out))
    throw std::invalid_argument(kind + " " + (errors.first().empty() ? origin : errors.first()));
}

std::string read_text_file(const std::string& path, const std::string& kind) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(kind + ": cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

modtrain::RunConfig parse_text(const std::string& text, const std::string& origin) {
  modtrain::RunConfig cfg;
  parse_text_message(text, origin, cfg, "config:");
  return cfg;
}

modtrain::RunConfig load_text(const std::string& path) {
  return parse_text(read_text_file(path, "config"), path);
}

void apply_override(modtrain::RunConfig& cfg, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw std::invalid_argument("config: --set '" + assignment + "': expected path.to.field=value");
  const std::string path = assignment.substr(0, eq), value = assignment.substr(eq + 1);
  pb::Message* msg = &cfg;
  std::stringstream ss(path);
  std::string part, walked;
  std::vector<std::string> parts;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::Descriptor* d = msg->GetDescriptor();
    const pb::FieldDescriptor* f = d->FindFieldByName(parts[i]);
    const std::string here = walked.empty() ? parts[i] : walked + "." + parts[i];
    if (!f) {
      std::string names;
      for (int k = 0; k < d->field_count(); ++k) names += (k ? ", " : "") + d->field(k)->name();
      bad_field(here, "unknown field (" + d->name() + " has: " + names + ")");
    }
    if (i + 1 < parts.size()) {
      if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE || f->is_repeated())
        bad_field(here, "is not a message, so it has no field '" + parts[i + 1] + "'");
      msg = msg->GetReflection()->MutableMessage(msg, f);
    } else if (f->is_repeated()) {
      msg->GetReflection()->ClearField(msg, f);
      for (const std::string& item : split_list(value)) set_scalar(*msg, f, item, here);
    } else {
      set_scalar(*msg, f, value, here);
    }
    walked = here;
  }
}

void validate(const modtrain::RunConfig& cfg) {
  const auto& m = cfg.model();
  auto positive = [](const std::string& field, int64_t v) {
    if (v <= 0) bad_field(field, std::to_string(v) + " must be positive");
  };
  positive("model.vocab_size", m.vocab_size());
  positive("model.d_model", m.d_model());
  positive("model.n_layers", m.n_layers());
  positive("model.n_heads", m.n_heads());
  positive("model.d_ff", m.d_ff());
  positive("model.seq_len", m.seq_len());
  if (m.d_model() % m.n_heads() != 0)
    bad_field("model.n_heads", std::to_string(m.n_heads()) + " heads do not divide model.d_model " +
                                   std::to_string(m.d_model()));
  if ((m.d_model() / m.n_heads()) % 2 != 0)
    bad_field("model.n_heads", "head dim d_model / n_heads = " +
                                   std::to_string(m.d_model() / m.n_heads()) +
                                   " must be even for rotary embeddings");
  const auto& mod = m.mod();
  if (mod.schedule() == modtrain::MoDConfig::EVERY_KTH && mod.every_k() < 1)
    bad_field("model.mod.every_k", std::to_string(mod.every_k()) + " must be >= 1");
  for (int i = 0; i < mod.routed_blocks_size(); ++i)
    if (mod.routed_blocks(i) < 0 || mod.routed_blocks(i) >= m.n_layers())
      bad_field("model.mod.routed_blocks[" + std::to_string(i) + "]",
                std::to_string(mod.routed_blocks(i)) + " is not a block in [0, " +
                    std::to_string(m.n_layers()) + ")");
  if (mod.causal().predictor_hidden() <= 0)
    bad_field("model.mod.causal.predictor_hidden", "must be positive");
  validate_moe(m);
  check_model_size(m);  // before anything is sized from the config
  const auto& o = cfg.optimizer();
  if (o.warmup_steps() < 0) bad_field("optimizer.warmup_steps", "must be >= 0");
  const auto& t = cfg.train();
  positive("train.steps", t.steps());
  positive("train.batch_size", t.batch_size());
  positive("train.grad_accum", t.grad_accum());
  if (t.eval_every() < 0) bad_field("train.eval_every", "must be >= 0 (0: never)");
  if (t.eval_every() > 0 && t.eval_batches() < 1)
    bad_field("train.eval_batches", std::to_string(t.eval_batches()) + " must be >= 1 (a divisor)");
  if (t.log_every() < 1)
    bad_field("train.log_every", std::to_string(t.log_every()) + " must be >= 1 (a divisor)");
  if (t.precision() == modtrain::TrainConfig::BF16 && t.device() != modtrain::TrainConfig::CUDA)
    bad_field("train.precision", "BF16 needs train.device: CUDA (the CPU kernels are f32/f64)");
  for (int i = 0; i < t.recompute_blocks_size(); ++i)
    if (t.recompute_blocks(i) < 0 || t.recompute_blocks(i) >= m.n_layers())
      bad_field("train.recompute_blocks[" + std::to_string(i) + "]",
                std::to_string(t.recompute_blocks(i)) + " is not a block in [0, " +
                    std::to_string(m.n_layers()) + ")");
  if (t.profile_steps() < 0) bad_field("train.profile_steps", "must be >= 0 (0: off)");
  if (t.profile_steps() > 0) {
    if (t.profile_from() < 0 || int64_t{t.profile_from()} + t.profile_steps() > t.steps())
      bad_field("train.profile_from", std::to_string(t.profile_from()) + " + train.profile_steps " +
                                          std::to_string(t.profile_steps()) +
                                          " must be within train.steps " + std::to_string(t.steps()));
  }
  const auto& p = cfg.parallel();
  if (t.cuda_graph()) {
    if (t.device() != modtrain::TrainConfig::CUDA)
      bad_field("train.cuda_graph", "needs train.device: CUDA (graphs are a CUDA feature)");
  }
  if (p.ep() > 1 && m.moe().enabled() && m.moe().n_experts() % p.ep() != 0)
    bad_field("parallel.ep", std::to_string(p.ep()) + " must divide model.moe.n_experts " +
                                 std::to_string(m.moe().n_experts()));
  // The stages built, by number (parallel/parallelize.h).
  static constexpr const char* kZeroStages[] = {"0 (off)", "1 (optimizer state sharded over dp)",
                                                "2 (and the reduced gradients)",
                                                "3 (and the parameters, gathered per block)"};
  if (p.zero_stage() < 0 || p.zero_stage() >= static_cast<int>(std::size(kZeroStages))) {
    std::string stages;
    for (const char* s : kZeroStages) stages += std::string(stages.empty() ? "" : ", ") + s;
    bad_field("parallel.zero_stage",
              std::to_string(p.zero_stage()) + " is not a stage: expected one of " + stages);
  }
  // One setting over dp: a config naming both is ambiguous even where they agree today.
  if (p.has_zero1() && p.has_zero_stage())
    bad_field("parallel.zero_stage",
              std::to_string(p.zero_stage()) + " and parallel.zero1 " +
                  (p.zero1() ? "true (stage 1)" : "false (stage 0)") +
                  " are both set: zero1 is the old name of zero_stage 1; keep parallel.zero_stage "
                  "alone and remove parallel.zero1");
  positive("parallel.dp", p.dp());
  positive("parallel.tp", p.tp());
  positive("parallel.ep", p.ep());
  validate_pipeline(cfg);
  if (p.sequence_parallel()) {
    if (p.tp() < 2)
      bad_field("parallel.sequence_parallel", "needs parallel.tp > 1 (tp is " +
                                                  std::to_string(p.tp()) + ")");
    if (m.seq_len() % p.tp() != 0)
      bad_field("parallel.sequence_parallel",
                "needs model.seq_len " + std::to_string(m.seq_len()) +
                    " divisible by parallel.tp " + std::to_string(p.tp()) +
                    " (each tp rank holds seq_len / tp positions)");
  }
  if (t.batch_size() % p.dp() != 0)
    bad_field("train.batch_size", std::to_string(t.batch_size()) +
                                      " must be divisible by parallel.dp " + std::to_string(p.dp()));
  const auto& c = cfg.checkpoint();
  if (c.every_steps() < 0)
    bad_field("checkpoint.every_steps", std::to_string(c.every_steps()) + " must be >= 0 (0: off)");
  if (c.keep_last() < 0)
    bad_field("checkpoint.keep_last",
              std::to_string(c.keep_last()) + " must be >= 0 (0 keeps all)");
  if (c.keep_every() < 0)
    bad_field("checkpoint.keep_every", std::to_string(c.keep_every()) + " must be >= 0 (0: none)");
  check_float_ranges(cfg);  // every float field, NaN and infinities included
  check_string_fields(cfg);  // every string field: NUL bytes, path limits
  if (o.min_lr() > o.lr())
    bad_field("optimizer.min_lr", std::to_string(o.min_lr()) + " must be in [0, optimizer.lr]");
  if (o.has_decay_policy() && (o.has_decay_norms_and_biases() || o.has_decay_embeddings()))
    bad_field("optimizer.decay_policy",
              std::string("and optimizer.") +
                  (o.has_decay_embeddings() ? "decay_embeddings" : "decay_norms_and_biases") +
                  " are both set: keep decay_policy alone (MATRICES_AND_EMBEDDING adds the "
                  "embedding, ALL norms and biases too)");
  // Decay scales every weight by 1 - lr * weight_decay per step: above 1 it flips their signs.
  if (o.lr() * o.weight_decay() > 1)
    bad_field("optimizer.weight_decay",
              std::to_string(o.weight_decay()) + " times optimizer.lr " + std::to_string(o.lr()) +
                  " must be at most 1 (AdamW scales each weight by 1 - lr * weight_decay)");
}

void validate_from(const modtrain::RunConfig& cfg, const std::string& origin) {
  try {
    validate(cfg);
  } catch (const std::invalid_argument& e) {
    std::string what = e.what();
    if (what.rfind("config: ", 0) == 0) what = what.substr(8);
    throw std::invalid_argument("config " + origin + ": " + what);
  }
}

modtrain::RunConfig parse_checked(const std::string& text, const std::string& origin) {
  modtrain::RunConfig cfg = parse_text(text, origin);
  validate_from(cfg, origin);
  return cfg;
}

modtrain::RunConfig load(const std::string& path, const std::vector<std::string>& overrides) {
  modtrain::RunConfig cfg = load_text(path);
  for (const auto& o : overrides) apply_override(cfg, o);
  validate(cfg);
  return cfg;
}

int zero_stage(const modtrain::ParallelConfig& p) {
  if (p.has_zero_stage()) return p.zero_stage();
  return p.zero1() ? 1 : 0;
}

bool cuda_graph_on(const modtrain::RunConfig& cfg) {
  const auto& t = cfg.train();
  if (t.has_cuda_graph()) return t.cuda_graph();
  const auto& p = cfg.parallel();
  return t.device() == modtrain::TrainConfig::CUDA && p.dp() == 1 && p.tp() == 1 && p.ep() == 1;
}

std::string to_text(const modtrain::RunConfig& cfg) {
  std::string out;
  pb::TextFormat::PrintToString(cfg, &out);
  return out;
}

}  // namespace mod::config
