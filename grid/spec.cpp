// GridSpec loading and validation (see grid.h).
#include "grid/spec.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <stdexcept>

#include "configs/config.h"

namespace mod::grid {

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A RunConfig error "config: model.mod.capacity: ..." re-homed under the spec field that holds
// the offending part: `prefix` replaces "config: " + `strip` (e.g. "model.mod." -> "variants[1].mod.").
std::string rehome(const std::string& error, const std::string& strip, const std::string& prefix) {
  std::string e = error;
  if (e.rfind("config: ", 0) == 0) e = e.substr(8);
  if (e.rfind(strip, 0) == 0) return prefix + e.substr(strip.size());
  return e;
}

// A value quoted in an error, cut to 40 characters: a hostile spec may hold megabytes.
std::string shown(const std::string& v) {
  std::string out = "'";
  out.append(v, 0, 40);
  if (v.size() <= 40) return out + "'";
  return out + "...' (" + std::to_string(v.size()) + " characters)";
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Skips the digits at s[i...]; whether there was at least one.
bool skip_digits(const std::string& s, size_t& i) {
  const size_t from = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  return i > from;
}

// Slurm's --time forms MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS: [D-]N[:N[:N]], checked by
// hand (std::regex recurses per character and overflows the stack on long input).
bool valid_slurm_time(const std::string& s) {
  if (s.empty() || s.size() > 32) return false;
  size_t i = 0;
  if (const size_t dash = s.find('-'); dash != std::string::npos)
    if (!skip_digits(s, i) || i++ != dash) return false;
  if (!skip_digits(s, i)) return false;
  for (int parts = 0; parts < 2 && i < s.size() && s[i] == ':'; ++parts)
    if (!skip_digits(s, ++i)) return false;
  return i == s.size();
}

}  // namespace

bool valid_grid_label(const std::string& label) {
  return !label.empty() && label.size() <= kMaxGridLabelChars &&
         std::all_of(label.begin(), label.end(), [](char c) {
           return is_digit(c) || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '.' ||
                  c == '-';
         });
}

modtrain::GridSpec parse_grid_text(const std::string& text, const std::string& origin) {
  modtrain::GridSpec spec;
  config::parse_text_message(text, origin, spec, "grid spec");
  return spec;
}

void validate_grid(const modtrain::GridSpec& spec, const std::string& origin) {
  auto fail = [&](const std::string& message) {
    throw std::invalid_argument("grid spec " + origin + ": " + message);
  };
  auto bad = [&](const std::string& field, const std::string& what) { fail(field + ": " + what); };
  auto label = [&](const std::string& field, const std::string& v) {
    if (!valid_grid_label(v))
      bad(field, shown(v) + " must be 1 to " + std::to_string(kMaxGridLabelChars) +
                     " letters, digits, '.' or '-' (no '_': it separates the parts of a point "
                     "name), e.g. \"s2\"");
  };
  if (!spec.has_name()) bad("name", "missing; e.g. name: \"cpu_small\"");
  if (spec.name().empty() || spec.name().size() > kMaxGridLabelChars ||
      spec.name().find_first_of(" \t\n/'\"") != std::string::npos)
    bad("name", shown(spec.name()) + " must be 1 to " + std::to_string(kMaxGridLabelChars) +
                    " characters without spaces, quotes or '/' (it names the output directory)");

  if (spec.budgets_size() == 0) bad("budgets", "none given; e.g. budgets: [1e13, 3e13]");
  for (int i = 0; i < spec.budgets_size(); ++i)
    if (!std::isfinite(spec.budgets(i)) || spec.budgets(i) <= 0)
      bad("budgets[" + std::to_string(i) + "]", num(spec.budgets(i)) + " must be a positive number of FLOPs");
  for (int i = 0; i < spec.budgets_size(); ++i)
    for (int j = 0; j < i; ++j)
      if (std::abs(spec.budgets(i) - spec.budgets(j)) <= 0.01 * std::max(spec.budgets(i), spec.budgets(j)))
        bad("budgets[" + std::to_string(i) + "]",
            num(spec.budgets(i)) + " is within 1% of budgets[" + std::to_string(j) + "] " +
                num(spec.budgets(j)) + " (point names carry budgets to 3 significant digits)");

  // The base, with the fields every point overrides made valid: steps, shape and routing.
  modtrain::RunConfig base = spec.base();
  base.mutable_train()->set_steps(1);
  base.mutable_model()->set_d_model(64);
  base.mutable_model()->set_n_layers(2);
  base.mutable_model()->set_n_heads(2);
  base.mutable_model()->set_d_ff(128);
  base.mutable_model()->clear_mod();
  try {
    config::validate(base);
  } catch (const std::invalid_argument& e) {
    fail("base." + rehome(e.what(), "", ""));
  }

  if (spec.shapes_size() == 0) bad("shapes", "none given; e.g. shapes { name: \"s1\" d_model: 64 ... }");
  std::set<std::string> names;
  int max_layers = 1;
  for (int i = 0; i < spec.shapes_size(); ++i) {
    const auto& s = spec.shapes(i);
    const std::string f = "shapes[" + std::to_string(i) + "]";
    if (!s.has_name()) bad(f + ".name", "missing");
    label(f + ".name", s.name());
    if (!names.insert(s.name()).second) bad(f + ".name", "'" + s.name() + "' names two shapes");
    const std::pair<const char*, bool> required[] = {{"d_model", s.has_d_model()},
                                                     {"n_layers", s.has_n_layers()},
                                                     {"n_heads", s.has_n_heads()},
                                                     {"d_ff", s.has_d_ff()}};
    for (const auto& [field, has] : required)
      if (!has) bad(f + "." + field, "missing (every shape sets d_model, n_layers, n_heads, d_ff)");
    const std::pair<const char*, int> sizes[] = {
        {"d_model", s.d_model()}, {"n_layers", s.n_layers()}, {"n_heads", s.n_heads()}, {"d_ff", s.d_ff()}};
    for (const auto& [field, v] : sizes)
      if (v <= 0) bad(f + "." + field, std::to_string(v) + " must be positive");
    if (s.d_model() % s.n_heads() != 0)
      bad(f + ".n_heads", std::to_string(s.n_heads()) + " heads do not divide " + f + ".d_model " +
                              std::to_string(s.d_model()));
    if ((s.d_model() / s.n_heads()) % 2 != 0)
      bad(f + ".n_heads", "head dim d_model / n_heads = " + std::to_string(s.d_model() / s.n_heads()) +
                              " must be even for rotary embeddings");
    // The bound on model sizes (configs/model_size.h), before anything sizes from the shape.
    modtrain::RunConfig sized = base;
    sized.mutable_model()->set_d_model(s.d_model());
    sized.mutable_model()->set_n_layers(s.n_layers());
    sized.mutable_model()->set_n_heads(s.n_heads());
    sized.mutable_model()->set_d_ff(s.d_ff());
    try {
      config::validate(sized);
    } catch (const std::invalid_argument& e) {
      const std::string why = rehome(e.what(), "model.", f + ".");
      fail(why.rfind(f, 0) == 0 ? why : f + ": " + why);  // the parameter bound names "model"
    }
    for (int j = 0; j < s.overrides_size(); ++j) {
      modtrain::RunConfig probe = base;
      try {
        config::apply_override(probe, s.overrides(j));
      } catch (const std::invalid_argument& e) {
        bad(f + ".overrides[" + std::to_string(j) + "]", rehome(e.what(), "", ""));
      }
    }
    max_layers = std::max(max_layers, s.n_layers());
  }

  names.clear();
  if (spec.variants_size() == 0)
    bad("variants", "none given; e.g. variants { name: \"dense\" } variants { name: \"mod\" mod { enabled: true } }");
  for (int i = 0; i < spec.variants_size(); ++i) {
    const auto& v = spec.variants(i);
    const std::string f = "variants[" + std::to_string(i) + "]";
    if (!v.has_name()) bad(f + ".name", "missing");
    label(f + ".name", v.name());
    if (!names.insert(v.name()).second) bad(f + ".name", "'" + v.name() + "' names two variants");
    // The routing on the deepest shape: blocks beyond a smaller shape's depth are a point's
    // problem (skipped at expansion), not the variant's.
    modtrain::RunConfig probe = base;
    probe.mutable_model()->set_n_layers(max_layers);
    *probe.mutable_model()->mutable_mod() = v.mod();
    try {
      config::validate(probe);
    } catch (const std::invalid_argument& e) {
      fail(rehome(e.what(), "model.mod.", f + ".mod."));
    }
    for (int j = 0; j < v.overrides_size(); ++j) {
      try {
        config::apply_override(probe, v.overrides(j));
      } catch (const std::invalid_argument& e) {
        bad(f + ".overrides[" + std::to_string(j) + "]", rehome(e.what(), "", ""));
      }
    }
  }

  if (spec.min_steps() < 1) bad("min_steps", std::to_string(spec.min_steps()) + " must be >= 1");
  if (!(spec.warmup_fraction() >= 0 && spec.warmup_fraction() < 1))
    bad("warmup_fraction", num(spec.warmup_fraction()) + " must be in [0, 1)");

  std::set<uint64_t> seeds = {spec.base().train().seed()};
  for (int i = 0; i < spec.extra_seeds_size(); ++i)
    if (!seeds.insert(spec.extra_seeds(i)).second)
      bad("extra_seeds[" + std::to_string(i) + "]",
          std::to_string(spec.extra_seeds(i)) + " repeats base.train.seed or another extra seed");
  if (spec.seed_budgets_size() > 0 && spec.extra_seeds_size() == 0)
    bad("seed_budgets", "given without extra_seeds; e.g. extra_seeds: [2]");
  for (int i = 0; i < spec.seed_budgets_size(); ++i) {
    bool known = false;
    for (double b : spec.budgets())
      known = known || std::abs(spec.seed_budgets(i) - b) <= 0.01 * b;
    if (!known)
      bad("seed_budgets[" + std::to_string(i) + "]",
          num(spec.seed_budgets(i)) + " is not one of budgets (within 1%)");
  }

  const auto& s = spec.slurm();
  if (!valid_slurm_time(s.time_limit()))
    bad("slurm.time_limit",
        shown(s.time_limit()) + " is not a Slurm time (MM, HH:MM:SS or D-HH:MM:SS)");
  if (s.nodes() < 1) bad("slurm.nodes", std::to_string(s.nodes()) + " must be >= 1");
  if (s.ntasks() < s.nodes())
    bad("slurm.ntasks", std::to_string(s.ntasks()) + " must be >= slurm.nodes " + std::to_string(s.nodes()));
  const int64_t ranks = int64_t{base.parallel().dp()} * base.parallel().tp();
  if (s.ntasks() != ranks)
    bad("slurm.ntasks", std::to_string(s.ntasks()) + " != base.parallel.dp " +
                            std::to_string(base.parallel().dp()) + " x base.parallel.tp " +
                            std::to_string(base.parallel().tp()) + " = " + std::to_string(ranks) +
                            " (one rank per task)");
  if (s.gpus_per_task() < 0) bad("slurm.gpus_per_task", "must be >= 0 (0: not requested)");
  if (s.cpus_per_task() < 1) bad("slurm.cpus_per_task", std::to_string(s.cpus_per_task()) + " must be >= 1");
  if (s.max_concurrent() < 0) bad("slurm.max_concurrent", "must be >= 0 (0: no limit)");
  if (s.signal_lead_s() < 0 || s.signal_lead_s() > 65535)
    bad("slurm.signal_lead_s", std::to_string(s.signal_lead_s()) + " must be in [0, 65535] seconds");
  for (int i = 0; i < s.extra_sbatch_size(); ++i)
    if (s.extra_sbatch(i).rfind("--", 0) != 0 || s.extra_sbatch(i).find('\n') != std::string::npos)
      bad("slurm.extra_sbatch[" + std::to_string(i) + "]",
          "'" + s.extra_sbatch(i) + "' must be one long option, e.g. \"--exclusive\"");
  for (int i = 0; i < s.setup_size(); ++i)
    if (s.setup(i).find('\n') != std::string::npos)
      bad("slurm.setup[" + std::to_string(i) + "]", "must be one line");
  const std::pair<const char*, const std::string*> plain[] = {
      {"slurm.partition", &s.partition()}, {"slurm.account", &s.account()}, {"slurm.qos", &s.qos()},
      {"slurm.mem", &s.mem()}, {"slurm.srun_args", &s.srun_args()}, {"slurm.modtrain", &s.modtrain()},
      {"out_dir", &spec.out_dir()}};
  for (const auto& [field, v] : plain)
    if (v->find_first_of("\n'\"") != std::string::npos) bad(field, "must not hold quotes or newlines");
}

modtrain::GridSpec load_grid(const std::string& path) {
  modtrain::GridSpec spec = parse_grid_text(config::read_text_file(path, "grid spec"), path);
  validate_grid(spec, path);
  return spec;
}

}  // namespace mod::grid
