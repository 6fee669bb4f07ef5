// Training loop (see trainer.h).
#include "core/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "configs/config.h"
#include "core/autograd.h"
#include "core/cpu/blas.h"
#include "core/data/shard.h"
#include "core/device_report.h"
#include "core/metrics/metrics_writer.h"
#include "core/model/flops.h"
#include "core/ops.h"
#include "core/train/weights.h"

namespace mod::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
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

DataSplits load_splits(const std::string& dir, int64_t model_vocab) {
  DataSplits d;
  data::ShardHeader h;
  d.train = std::make_shared<const std::vector<uint32_t>>(data::read_shard(dir + "/train.bin", &h));
  d.vocab_size = h.vocab_size;
  d.val = std::make_shared<const std::vector<uint32_t>>(data::read_shard(dir + "/val.bin", &h));
  if (h.vocab_size != d.vocab_size)
    throw std::runtime_error("data " + dir + ": train.bin and val.bin have different vocabularies");
  if (d.vocab_size != model_vocab)
    throw std::invalid_argument("config: model.vocab_size " + std::to_string(model_vocab) +
                                " does not match the data's vocabulary " +
                                std::to_string(d.vocab_size) + " (" + dir + ")");
  return d;
}

EvalResult evaluate(const model::Transformer& model, const std::vector<uint32_t>& tokens,
                    int64_t seq_len, int64_t batch, int64_t max_batches, model::RoutingMode mode) {
  NoGradGuard no_grad;
  EvalResult r;
  const auto batches = data::sequential_batches(tokens, seq_len, batch, max_batches);
  if (batches.empty())
    throw std::invalid_argument("evaluate: " + std::to_string(tokens.size()) +
                                " validation tokens cannot fill one batch of " +
                                std::to_string(batch) + " x " + std::to_string(seq_len));
  for (const auto& b : batches) {
    r.loss += model.forward(b.inputs, b.targets, mode).lm_loss.item();
    r.tokens += b.inputs.numel();
  }
  r.loss /= static_cast<double>(batches.size());
  return r;
}

double measured_peak_flops() {
  static const double peak = [] {
    const int64_t m = 1024, n = 1024, k = 1024;
    std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n);
    double best = 1e30;  // best of 12 after 2 warm-up calls: other load only ever slows a call
    for (int rep = 0; rep < 14; ++rep) {
      auto t0 = Clock::now();
      cpu::blas_gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
      if (rep >= 2) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return 2.0 * m * n * k / best;
  }();
  return peak;
}

Trainer::Trainer(modtrain::RunConfig cfg, std::string run_dir, bool quiet)
    : cfg_(std::move(cfg)), run_dir_(std::move(run_dir)), quiet_(quiet) {
  config::validate(cfg_);
  data_ = load_splits(cfg_.data().dir(), cfg_.model().vocab_size());
  model_ = std::make_unique<model::Transformer>(cfg_.model(), cfg_.train().seed());
  optimizer_ = std::make_unique<AdamW>(model_->named_parameters(), cfg_.optimizer());
  loader_ = std::make_unique<data::WindowLoader>(data_.train, cfg_.model().seq_len(),
                                                 cfg_.train().batch_size(), cfg_.train().seed());
  fs::create_directories(run_dir_);
  std::ofstream(run_dir_ + "/config.textproto") << config::to_text(cfg_);
}

double Trainer::train_step(int64_t step) {
  const int accum = cfg_.train().grad_accum();
  model_->zero_grad();
  double loss = 0, aux = 0;
  for (int micro = 0; micro < accum; ++micro) {
    data::Batch batch = loader_->next();
    model::ForwardResult r = model_->forward(batch.inputs, batch.targets);
    scale(r.loss, 1.0 / accum).backward();
    loss += r.lm_loss.item() / accum;
    if (r.aux_loss.defined()) aux += r.aux_loss.item() / accum;
    if (micro == accum - 1) last_stats_ = std::move(r.stats);
  }
  const auto params = model_->parameters();
  last_grad_norm_ = clip_grad_norm(params, cfg_.optimizer().grad_clip());
  if (!std::isfinite(loss) || !std::isfinite(last_grad_norm_))
    throw std::runtime_error("training diverged at step " + std::to_string(step) + ": loss " +
                             std::to_string(loss) + ", gradient norm " +
                             std::to_string(last_grad_norm_) + " (lower optimizer.lr?)");
  optimizer_->step(learning_rate(cfg_.optimizer(), step, cfg_.train().steps()));
  last_aux_ = aux;
  return loss;
}

double Trainer::run() {
  const auto& t = cfg_.train();
  const int64_t steps = t.steps();
  const double tokens_per_step =
      static_cast<double>(t.batch_size()) * t.grad_accum() * cfg_.model().seq_len();
  const model::FlopCount flops = model::count_flops(cfg_.model());
  const double peak = measured_peak_flops();
  if (!quiet_)
    std::printf("%s\nmodel %s: %.2fM parameters, %.3g training FLOPs/token; MFU against the "
                "measured SGEMM rate %.1f GFLOP/s\n",
                device_report().c_str(), cfg_.name().c_str(), flops.parameters / 1e6,
                flops.training_per_token, peak / 1e9);

  std::vector<std::string> columns = {"lm_loss", "aux_loss", "val_loss", "lr", "grad_norm",
                                      "tokens_per_s", "mfu"};
  for (int b = 0; b < model_->config().n_layers(); ++b)
    if (model_->routed(b))
      for (const char* k : {"router_mean", "router_std", "predictor_acc", "precision", "recall"})
        columns.push_back("block" + std::to_string(b) + "_" + k);
  metrics::CsvWriter csv(run_dir_ + "/metrics.csv", columns);
  metrics::TensorBoardWriter tb(run_dir_ + "/tb");

  const auto start = Clock::now();
  double loss = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const auto t0 = Clock::now();
    loss = train_step(step);
    losses_.push_back(loss);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    const double tok_s = tokens_per_step / dt;
    const double mfu = flops.training_per_token * tok_s / peak;
    std::map<std::string, double> m = {{"lm_loss", loss},
                                       {"lr", learning_rate(cfg_.optimizer(), step, steps)},
                                       {"grad_norm", last_grad_norm_},
                                       {"tokens_per_s", tok_s},
                                       {"mfu", mfu}};
    if (last_aux_ != 0) m["aux_loss"] = last_aux_;
    for (const auto& s : last_stats_) {
      const std::string p = "block" + std::to_string(s.block) + "_";
      m[p + "router_mean"] = s.router_mean;
      m[p + "router_std"] = s.router_std;
      m[p + "predictor_acc"] = s.accuracy;
      m[p + "precision"] = s.precision;
      m[p + "recall"] = s.recall;
      for (size_t k = 0; k < s.routed_fraction_by_bucket.size(); ++k)
        tb.scalar("routing/" + p + "routed_frac_bucket" + std::to_string(k),
                  s.routed_fraction_by_bucket[k], step + 1);
    }
    const bool last = step + 1 == steps;
    if (t.eval_every() > 0 && ((step + 1) % t.eval_every() == 0 || last)) {
      m["val_loss"] = evaluate(*model_, *data_.val, cfg_.model().seq_len(), t.batch_size(),
                               t.eval_batches(), model::RoutingMode::TopC)
                          .loss;
    }
    csv.row(step + 1, loss, m);
    for (const auto& [k, v] : m) tb.scalar(k == "lm_loss" ? "loss" : k, v, step + 1);
    tb.flush();
    if (!quiet_ && ((step + 1) % t.log_every() == 0 || last)) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      const double eta = elapsed / (step + 1) * (steps - step - 1);
      std::printf("step %5lld/%lld | loss %.4f", static_cast<long long>(step + 1),
                  static_cast<long long>(steps), loss);
      if (m.count("val_loss")) std::printf(" | val %.4f", m["val_loss"]);
      std::printf(" | lr %.2e | %6.0f tok/s | MFU %4.1f%% | ETA %s\n", m["lr"], tok_s, 100 * mfu,
                  format_duration(eta).c_str());
      std::fflush(stdout);
    }
  }
  save_weights(run_dir_ + "/model.safetensors", *model_, cfg_, steps);
  if (!quiet_) std::printf("wrote %s/model.safetensors\n", run_dir_.c_str());
  return loss;
}

}  // namespace mod::train
