// Training loop (see trainer.h).
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "configs/config.h"
#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/cpu/blas.h"
#include "core/device_report.h"
#include "model/flops.h"
#include "parallel/device_communicator.h"
#include "train/data/shard.h"
#include "train/metrics/metrics_writer.h"
#include "train/stop_signal.h"
#include "train/weights.h"
#ifdef MOD_HAVE_CUDA
#include "core/cuda/device.h"
#endif

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
                    int64_t seq_len, int64_t batch, int64_t max_batches, model::RoutingMode mode,
                    parallel::Communicator* dp) {
  NoGradGuard no_grad;
  const auto batches = data::sequential_batches(tokens, seq_len, batch, max_batches);
  if (batches.empty())
    throw std::invalid_argument("evaluate: " + std::to_string(tokens.size()) +
                                " validation tokens cannot fill one batch of " +
                                std::to_string(batch) + " x " + std::to_string(seq_len));
  const size_t stride = dp ? dp->size() : 1, first = dp ? dp->rank() : 0;
  Tensor sums = Tensor::zeros({2}, DType::F64);  // loss sum, tokens
  const Device device = model.parameters().front().device();
  for (size_t i = first; i < batches.size(); i += stride) {
    sums.data<double>()[0] += model.forward(batches[i].inputs.to(device),
                                            batches[i].targets.to(device), mode).lm_loss.item();
    sums.data<double>()[1] += static_cast<double>(batches[i].inputs.numel());
  }
  if (dp) dp->all_reduce(sums);
  EvalResult r;
  r.loss = sums.data<double>()[0] / static_cast<double>(batches.size());
  r.tokens = static_cast<int64_t>(sums.data<double>()[1]);
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

namespace {
// One MoE layer's statistics as metrics, only those its routing has: "moe_block<b>_unrouted",
// "_noop" with a no-op expert, "_dropped" and "_max_load" under token choice.
std::map<std::string, double> moe_metrics(const model::MoeStats& s, const modtrain::MoEConfig& cfg) {
  const std::string p = "moe_block" + std::to_string(s.block) + "_";
  std::map<std::string, double> m = {{p + "unrouted", s.unrouted_fraction}};
  if (cfg.noop_expert()) m[p + "noop"] = s.noop_fraction;
  if (cfg.routing() == modtrain::MoEConfig::TOKEN_CHOICE) {
    m[p + "dropped"] = s.dropped_fraction;
    m[p + "max_load"] = s.max_load;
  }
  return m;
}

}  // namespace

Trainer::Trainer(modtrain::RunConfig cfg, std::string run_dir, bool quiet,
                 parallel::Communicator& world)
    : cfg_(std::move(cfg)), run_dir_(std::move(run_dir)), quiet_(quiet),
      writer_(world.rank() == 0) {
  config::validate(cfg_);
  const auto dims = parallel::ParallelDims::from_config(cfg_.parallel());
  dims.validate(world.size());
  dims.validate_model(cfg_.model());
  device_ = cfg_.train().device() == modtrain::TrainConfig::CUDA ? Device::CUDA : Device::CPU;
  if (device_ == Device::CUDA && world.size() > 1) device_comm_ = parallel::make_device_communicator(world);
  mesh_ = std::make_unique<parallel::Mesh>(device_comm_ ? *device_comm_ : world, dims);
  data_ = load_splits(cfg_.data().dir(), cfg_.model().vocab_size());
  model_ = std::make_unique<model::Transformer>(cfg_.model(), cfg_.train().seed());
  shards_ = parallel::parallelize_tensor(*model_, *mesh_);
  parallel::parallelize_experts(*model_, *mesh_, shards_);
  // Parameters are made and sharded on the host (the same init on every device), then moved;
  // everything below (buckets, optimizer state) is allocated beside them.
  model_->to(device_);
  const auto params = model_->named_parameters();
  std::vector<std::pair<std::string, Tensor>> dense, experts;
  for (const auto& p : params) (shards_.at(p.first).expert ? experts : dense).push_back(p);
  const double bucket_mb = cfg_.parallel().bucket_mb();
  if (dims.dp > 1)
    buckets_ = std::make_unique<parallel::GradBucketer>(dense, mesh_->dp(), bucket_mb);
  // Expert gradients: the all-to-all summed the ep group's tokens in; the edp group (dp / ep
  // replicas times the tp shares of the slots) sums the rest; dividing by dp makes the mean.
  if (!experts.empty() && (dims.dp > 1 || mesh_->edp().size() > 1))
    expert_buckets_ = std::make_unique<parallel::GradBucketer>(experts, mesh_->edp(), bucket_mb, dims.dp);
  if (cfg_.parallel().zero1()) {
    std::vector<parallel::ShardedAdamW::Param> zd, ze;
    for (const auto& [name, t] : params) {
      auto& group = shards_.at(name).expert ? ze : zd;
      zero1_index_.push_back(group.size());
      group.push_back({name, t, takes_weight_decay(name, cfg_.optimizer())});
    }
    zero1_ = std::make_unique<parallel::ShardedAdamW>(std::move(zd), adamw_hyper(cfg_.optimizer()), mesh_->dp());
    if (!ze.empty())
      zero1_experts_ = std::make_unique<parallel::ShardedAdamW>(std::move(ze), adamw_hyper(cfg_.optimizer()), mesh_->edp());
  } else {
    optimizer_ = std::make_unique<AdamW>(params, cfg_.optimizer());
  }
  const int64_t rows = cfg_.train().batch_size() / dims.dp;
  row_begin_ = mesh_->dp_rank() * rows;
  row_end_ = row_begin_ + rows;
  loader_ = std::make_unique<data::WindowLoader>(data_.train, cfg_.model().seq_len(),
                                                 cfg_.train().batch_size(), cfg_.train().seed());
  const char* check = std::getenv("MOD_CHECK_TP_ROUTING");
  check_routing_ = check && std::string(check) == "1";
  if (writer_) {
    fs::create_directories(run_dir_);
    std::ofstream(run_dir_ + "/config.textproto") << config::to_text(cfg_);
  }
}

std::vector<std::pair<std::string, Tensor>> Trainer::full_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : model_->named_parameters())
    out.emplace_back(name, parallel::gather_parameter(t, shards_.at(name),
                                                      parallel::group_of(shards_.at(name), *mesh_)));
  return out;
}

parallel::ShardedAdamW& Trainer::zero1_for(const std::string& name) const {
  return shards_.at(name).expert ? *zero1_experts_ : *zero1_;
}

// MFU's denominator for one process: its GPU's dense peak (bf16 tensor cores under BF16, f32
// otherwise), or the SGEMM rate measured on the host.
double Trainer::peak_flops_per_process() const {
#ifdef MOD_HAVE_CUDA
  if (device_ == Device::CUDA) {
    const double peak = cuda::peak_flops(cfg_.train().precision() == modtrain::TrainConfig::BF16);
    if (peak > 0) return peak;  // 0: no real GPU (the tests' emulated device)
  }
#endif
  return measured_peak_flops();
}

double Trainer::run() {
  const auto& t = cfg_.train();
  const int64_t steps = t.steps();
  const double tokens_per_step =
      static_cast<double>(t.batch_size()) * t.grad_accum() * cfg_.model().seq_len();
  const model::FlopCount flops = model::count_flops(cfg_.model());
  // MFU is against every process's share of the machine: the SGEMM rate one rank measures
  // (while the others do the same) times the world size.
  const int world = mesh_->world().size();
  const double peak = peak_flops_per_process() * world;
  if (!quiet_) {
    std::printf("%s\nmodel %s: %.2fM parameters, %.3g training FLOPs/token; MFU against %s "
                "%.1f GFLOP/s\n",
                device_report().c_str(), cfg_.name().c_str(), flops.parameters / 1e6,
                flops.training_per_token,
                device_ == Device::CUDA ? "the GPU's dense peak" : "the measured SGEMM rate",
                peak / 1e9);
    if (world > 1)
      std::printf("parallel: %d processes (%s) = dp %d x tp %d (ep %d)%s, %zu gradient buckets\n", world,
                  parallel::launch_info().source.c_str(), mesh_->dims().dp, mesh_->dims().tp,
                  mesh_->dims().ep, zero1_ ? ", ZeRO-1 optimizer sharding" : "",
                  buckets_ ? buckets_->num_buckets() : size_t{0});
  }

  std::vector<std::string> columns = {"lm_loss", "aux_loss", "val_loss", "lr", "grad_norm",
                                      "tokens_per_s", "mfu"};
  for (int b = 0; b < model_->config().n_layers(); ++b)
    if (model_->routed(b))
      for (const char* k : {"router_mean", "router_std", "predictor_acc", "precision", "recall"})
        columns.push_back("block" + std::to_string(b) + "_" + k);
  for (int b = 0; b < model_->config().n_layers(); ++b) {
    model::MoeStats names;  // only its block and the config decide the names
    names.block = b;
    if (model_->moe(b))
      for (const auto& [name, _] : moe_metrics(names, cfg_.model().moe())) columns.push_back(name);
  }
  // Only world rank 0 writes; the others compute the same reduced metrics and drop them.
  std::unique_ptr<metrics::CsvWriter> csv;
  std::unique_ptr<metrics::TensorBoardWriter> tb;
  if (writer_) {
    // A resumed run rewrites the steps after its checkpoint; a fresh one starts empty files.
    metrics::CsvWriter::truncate_after(run_dir_ + "/metrics.csv", start_step_);
    metrics::TensorBoardWriter::truncate_after(run_dir_ + "/tb", start_step_);
    csv = std::make_unique<metrics::CsvWriter>(run_dir_ + "/metrics.csv", columns);
    tb = std::make_unique<metrics::TensorBoardWriter>(run_dir_ + "/tb");
  }

  install_stop_handlers();
  const bool checkpointing = cfg_.checkpoint().every_steps() > 0 || cfg_.checkpoint().every_minutes() > 0;
  const auto start = Clock::now();
  auto last_save = start;
  auto elapsed = [&] { return elapsed_before_ + std::chrono::duration<double>(Clock::now() - start).count(); };
  double loss = 0;
  for (int64_t step = start_step_; step < steps; ++step) {
    if (checkpointer_) checkpointer_->wait();  // a background save commits at a step boundary
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
      for (size_t k = 0; tb && k < s.routed_fraction_by_bucket.size(); ++k)
        tb->scalar("routing/" + p + "routed_frac_bucket" + std::to_string(k),
                  s.routed_fraction_by_bucket[k], step + 1);
    }
    for (const auto& s : last_moe_stats_) m.merge(moe_metrics(s, cfg_.model().moe()));
    const bool last = step + 1 == steps;
    if (t.eval_every() > 0 && ((step + 1) % t.eval_every() == 0 || last)) {
      m["val_loss"] = evaluate(*model_, *data_.val, cfg_.model().seq_len(), t.batch_size(),
                               t.eval_batches(), model::RoutingMode::TopC, &mesh_->dp())
                          .loss;
    }
    if (writer_) {
      csv->row(step + 1, loss, m);
      for (const auto& [k, v] : m) tb->scalar(k == "lm_loss" ? "loss" : k, v, step + 1);
      tb->flush();
    }
    if (!quiet_ && ((step + 1) % t.log_every() == 0 || last)) {
      const double run_s = std::chrono::duration<double>(Clock::now() - start).count();
      const double eta = run_s / (step + 1 - start_step_) * (steps - step - 1);
      std::printf("step %5lld/%lld | loss %.4f", static_cast<long long>(step + 1),
                  static_cast<long long>(steps), loss);
      if (m.count("val_loss")) std::printf(" | val %.4f", m["val_loss"]);
      std::printf(" | lr %.2e | %6.0f tok/s | MFU %4.1f%% | ETA %s\n", m["lr"], tok_s, 100 * mfu,
                  format_duration(eta).c_str());
      std::fflush(stdout);
    }
    // Every rank learns whether any rank was signalled, so all of them stop after this step.
    const bool stop = any_rank_stopping();
    const double since_save = std::chrono::duration<double>(Clock::now() - last_save).count() / 60;
    if (stop || (checkpointing && (last || checkpoint_due(step + 1, since_save)))) {
      save_checkpoint(step + 1, elapsed());
      last_save = Clock::now();
    }
    if (stop) {
      if (checkpointer_) checkpointer_->wait();
      stopped_ = true;
      if (!quiet_)
        std::printf("stopping after step %lld on SIGTERM/SIGUSR1: checkpoint written, exit %d; "
                    "continue with --resume auto\n",
                    static_cast<long long>(step + 1), kExitCheckpointedStop);
      return loss;
    }
  }
  if (checkpointer_) checkpointer_->wait();
  const auto full = full_parameters();
  if (writer_) save_weights(run_dir_ + "/model.safetensors", full, cfg_, steps);
  if (!quiet_) std::printf("wrote %s/model.safetensors\n", run_dir_.c_str());
  return loss;
}

}  // namespace mod::train
