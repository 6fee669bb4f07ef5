// A step's metrics as metrics.csv columns and TensorBoard scalars (see run_metrics.h).
#include "train/run_metrics.h"

#include <chrono>
#include <cstdio>

#include "core/cpu/blas.h"

namespace mod::train {

namespace {
// The run-wide metrics, in metrics.csv's column order.
struct RunMetric {
  const char* name;
  std::optional<double> StepMetrics::*value;
};
constexpr RunMetric kRunMetrics[] = {{"lm_loss", &StepMetrics::lm_loss},
                                     {"aux_loss", &StepMetrics::aux_loss},
                                     {"val_loss", &StepMetrics::val_loss},
                                     {"val_loss_causal", &StepMetrics::val_loss_causal},
                                     {"lr", &StepMetrics::lr},
                                     {"grad_norm", &StepMetrics::grad_norm},
                                     {"tokens_per_s", &StepMetrics::tokens_per_s},
                                     {"mfu", &StepMetrics::mfu},
                                     {"peak_memory_mb", &StepMetrics::peak_memory_mb}};

// Each routed block's, as "block<b>_<name>".
struct RouterMetric {
  const char* name;
  double model::RoutedBlockStats::*value;
};
constexpr RouterMetric kRouterMetrics[] = {{"router_mean", &model::RoutedBlockStats::router_mean},
                                           {"router_std", &model::RoutedBlockStats::router_std},
                                           {"predictor_acc", &model::RoutedBlockStats::accuracy},
                                           {"precision", &model::RoutedBlockStats::precision},
                                           {"recall", &model::RoutedBlockStats::recall}};

// Each MoE block's, as "moe_block<b>_<name>", only those its routing has: a no-op expert's
// share, and drops and load under token choice. Alphabetical: metrics.csv's column order.
bool always(const modtrain::MoEConfig&) {
  return true;
}
bool with_noop(const modtrain::MoEConfig& c) {
  return c.noop_expert();
}
bool token_choice(const modtrain::MoEConfig& c) {
  return c.routing() == modtrain::MoEConfig::TOKEN_CHOICE;
}
struct MoeMetric {
  const char* name;
  double model::MoeStats::*value;
  bool (*reported)(const modtrain::MoEConfig&);
};
constexpr MoeMetric kMoeMetrics[] = {{"dropped", &model::MoeStats::dropped_fraction, token_choice},
                                     {"max_load", &model::MoeStats::max_load, token_choice},
                                     {"noop", &model::MoeStats::noop_fraction, with_noop},
                                     {"unrouted", &model::MoeStats::unrouted_fraction, always}};

std::string router_name(int block, const RouterMetric& m) {
  return "block" + std::to_string(block) + "_" + m.name;
}
std::string agreement_name(int block) {
  return "block" + std::to_string(block) + "_agreement";
}
std::string moe_name(int block, const MoeMetric& m) {
  return "moe_block" + std::to_string(block) + "_" + m.name;
}

constexpr const char* kPredictorGradNorm = "predictor_grad_norm";
constexpr const char* kPpBubble = "pp_bubble";  // pipelined runs only

std::vector<std::string> columns(const model::Transformer& model, bool pipelined) {
  std::vector<std::string> out;
  for (const RunMetric& m : kRunMetrics) out.push_back(m.name);
  const int blocks = model.config().n_layers();
  const bool causal = model.config().mod().causal().method() != modtrain::CausalRoutingConfig::NONE;
  bool any_routed = false;
  for (int b = 0; b < blocks; ++b) any_routed = any_routed || model.routed(b);
  // Every routed block has a predictor under the PREDICTOR method.
  if (any_routed &&
      model.config().mod().causal().method() == modtrain::CausalRoutingConfig::PREDICTOR)
    out.push_back(kPredictorGradNorm);
  for (int b = 0; b < blocks; ++b)
    if (model.routed(b)) {
      for (const RouterMetric& m : kRouterMetrics) out.push_back(router_name(b, m));
      if (causal) out.push_back(agreement_name(b));
    }
  for (int b = 0; b < blocks; ++b)
    if (model.moe(b))
      for (const MoeMetric& m : kMoeMetrics)
        if (m.reported(model.config().moe())) out.push_back(moe_name(b, m));
  // Last, so every other column sits where one process's does: a pp run's metrics.csv compared
  // with one process's by position (paste, awk $N) would otherwise read each later column one
  // to the right, e.g. blockN_recall as blockN_agreement.
  if (pipelined) out.push_back(kPpBubble);
  return out;
}

std::map<std::string, double> values(const StepMetrics& s, const modtrain::MoEConfig& moe) {
  std::map<std::string, double> out;
  for (const RunMetric& m : kRunMetrics)
    if (s.*m.value) out[m.name] = *(s.*m.value);
  if (s.predictor_grad_norm) out[kPredictorGradNorm] = *s.predictor_grad_norm;
  if (s.pp_bubble) out[kPpBubble] = *s.pp_bubble;
  for (const auto& r : s.routed)
    for (const RouterMetric& m : kRouterMetrics) out[router_name(r.block, m)] = r.*m.value;
  for (const auto& [block, share] : s.agreement) out[agreement_name(block)] = share;
  for (const auto& e : s.moe)
    for (const MoeMetric& m : kMoeMetrics)
      if (m.reported(moe)) out[moe_name(e.block, m)] = e.*m.value;
  return out;
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  return buf;
}
}  // namespace

MetricsLog::MetricsLog(const std::string& run_dir, const model::Transformer& model,
                       int64_t start_step, bool pipelined)
    : moe_(model.config().moe()) {
  metrics::CsvWriter::truncate_after(run_dir + "/metrics.csv", start_step);
  metrics::TensorBoardWriter::truncate_after(run_dir + "/tb", start_step);
  csv_ = std::make_unique<metrics::CsvWriter>(run_dir + "/metrics.csv", columns(model, pipelined));
  tb_ = std::make_unique<metrics::TensorBoardWriter>(run_dir + "/tb");
}

void MetricsLog::write(int64_t steps_done, const StepMetrics& m) {
  // TensorBoard only: where in the sequence each routed block takes its tokens.
  for (const auto& s : m.routed)
    for (size_t k = 0; k < s.routed_fraction_by_bucket.size(); ++k)
      tb_->scalar(
          "routing/block" + std::to_string(s.block) + "_routed_frac_bucket" + std::to_string(k),
          s.routed_fraction_by_bucket[k], steps_done);
  for (const auto& s : m.routed)
    if (s.router_histogram.num > 0)
      tb_->histogram("block" + std::to_string(s.block) + "_router_scores", s.router_histogram,
                     steps_done);
  const auto row = values(m, moe_);
  csv_->row(steps_done, *m.lm_loss, row);
  // TensorBoard has always called the training loss "loss".
  for (const auto& [k, v] : row) tb_->scalar(k == "lm_loss" ? "loss" : k, v, steps_done);
  tb_->flush();
}

void print_progress(int64_t steps_done, int64_t steps, const StepMetrics& m, double eta_seconds) {
  std::printf("step %5lld/%lld | loss %.4f", static_cast<long long>(steps_done),
              static_cast<long long>(steps), *m.lm_loss);
  if (m.val_loss) std::printf(" | val %.4f", *m.val_loss);
  if (m.val_loss_causal) std::printf(" (causal %.4f)", *m.val_loss_causal);
  std::printf(" | lr %.2e | %6.0f tok/s | MFU %4.1f%%", *m.lr, *m.tokens_per_s, 100 * *m.mfu);
  if (m.peak_memory_max_mb)
    std::printf(" | mem %.2f GiB (max over ranks)", *m.peak_memory_max_mb / 1024);
  else if (m.peak_memory_mb)
    std::printf(" | mem %.2f GiB", *m.peak_memory_mb / 1024);
  std::printf(" | ETA %s\n", format_duration(eta_seconds).c_str());
  std::fflush(stdout);
}

double measured_peak_flops() {
  using Clock = std::chrono::steady_clock;
  const int64_t m = 1024, n = 1024, k = 1024;
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n);
  double best = 1e30;  // best of 12 after 2 warm-up calls: other load only ever slows a call
  for (int rep = 0; rep < 14; ++rep) {
    auto t0 = Clock::now();
    cpu::blas_gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    if (rep >= 2) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * m * n * k / best;
}

}  // namespace mod::train
