// Training loop (see trainer.h): construction, and run() as its pieces: a timed step, its log
// line and files, evaluation, then checkpoint and stop (trainer_checkpoint.cpp).
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "configs/config.h"
#include "core/cpu/cpu_peak.h"
#include "core/cpu/op_trace.h"
#include "core/backend.h"
#include "core/device_report.h"
#include "core/device_trace.h"
#include "core/util/atomic_file.h"
#include "model/memory_plan.h"
#include "model/routing_trace.h"
#include "parallel/adamw.h"
#include "parallel/device_communicator.h"
#include "parallel/pipeline_training.h"
#include "train/data/loader.h"
#include "train/lr_schedule.h"
#include "train/metrics/kernel_profile.h"
#include "train/stop_signal.h"
#include "train/weights.h"
#ifdef MOD_HAVE_CUDA
#include "core/cuda/device.h"
#endif

namespace mod::train {

namespace fs = std::filesystem;

parallel::OptimizerFusion optimizer_fusion(const modtrain::TrainConfig& t) {
  parallel::OptimizerFusion f;
  f.multi_tensor = t.fusions().optimizer_weight_copies();
  if (f.multi_tensor && t.precision() == modtrain::TrainConfig::BF16) f.weight_copies = DType::BF16;
  return f;
}

Trainer::Trainer(modtrain::RunConfig cfg, std::string run_dir, bool quiet,
                 parallel::Communicator& world, const TestHooks& hooks)
    : cfg_(std::move(cfg)), run_dir_(std::move(run_dir)), quiet_(quiet),
      writer_(world.rank() == 0), hooks_(hooks) {
  config::validate(cfg_);
  const auto dims = parallel::ParallelDims::from_config(cfg_.parallel());
  dims.validate(world.size());
  dims.validate_model(cfg_.model());
  device_ = cfg_.train().device() == modtrain::TrainConfig::CUDA ? Device::CUDA : Device::CPU;
  if (device_ == Device::CUDA && world.size() > 1) device_comm_ = parallel::make_device_communicator(world);
  mesh_ = std::make_unique<parallel::Mesh>(device_comm_ ? *device_comm_ : world, dims);
  data_ = load_dataset(cfg_.data().dir(), cfg_.model().vocab_size());
  model_ = std::make_unique<model::Transformer>(cfg_.model(), cfg_.train().seed(), DType::F32,
                                                model::fusions_from(cfg_.train()));
  model_->set_recompute(cfg_.train().recompute(), {cfg_.train().recompute_blocks().begin(),
                                                   cfg_.train().recompute_blocks().end()});
  model_->set_fused_classifier(cfg_.train().fusions().classifier());
  plan_ = parallel::parallelize(*model_, *mesh_, cfg_.parallel(), device_, cfg_.optimizer(),
                                optimizer_fusion(cfg_.train()));
  setup_pipeline();
  const int64_t rows = cfg_.train().batch_size() / dims.dp;
  row_begin_ = mesh_->dp_rank() * rows;
  row_end_ = row_begin_ + rows;
  loader_ = std::make_unique<data::WindowLoader>(data_.train, cfg_.model().seq_len(),
                                                 cfg_.train().batch_size(), cfg_.train().seed());
  if (cfg_.train().eval_every() > 0)  // found now, not at the first evaluation after training steps
    check_evaluable(data_.val, cfg_.model().seq_len(), cfg_.train().batch_size());
  if (writer_) {
    fs::create_directories(run_dir_);
    util::replace_file(run_dir_ + "/config.textproto", config::to_text(cfg_));
  }
}

std::vector<std::pair<std::string, Tensor>> Trainer::full_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  // ZeRO-3 and pp release what they made whole when these end: the result holds copies.
  const parallel::ParallelPlan::WholeParameters whole(plan_);
  const auto stages = whole_across_stages(/*broadcast=*/true);  // after: ZeRO-3's units whole
  const bool copy = whole.units || pipeline_partition_;
  for (const auto& [name, t] : model_->named_parameters()) {
    const parallel::ShardSpec& spec = plan_.shards.at(name);
    Tensor full = parallel::gather_parameter(t, spec, parallel::group_of(spec, *mesh_));
    out.emplace_back(name, copy && full.same(t) ? full.clone() : full);
  }
  return out;
}

// MFU's denominator for one process: its GPU's dense datasheet peak (bf16 tensor cores under
// BF16, f32 otherwise), or its share of the CPU's stated peak (cores x FLOP/cycle x clock).
double Trainer::peak_flops_per_process() const {
#ifdef MOD_HAVE_CUDA
  if (device_ == Device::CUDA) {
    const double peak = cuda::peak_flops(cfg_.train().precision() == modtrain::TrainConfig::BF16);
    if (peak > 0) return peak;  // 0: no real GPU (the tests' emulated device)
  }
#endif
  return cpu::cpu_peak(parallel::launch_info().local_size).flops();
}

double Trainer::run() {
  const int64_t steps = cfg_.train().steps();
  const model::FlopCount flops = model::count_flops(cfg_.model());
  flops_per_token_ = flops.training_per_token;
  // MFU is against the whole job: every process's share of its machine's peak.
  peak_flops_ = peak_flops_per_process() * mesh_->world().size();
  if (!quiet_) print_run_header(flops);
  // Only world rank 0 writes; the others compute the same reduced metrics and drop them.
  if (writer_)
    log_ = std::make_unique<MetricsLog>(run_dir_, *model_, start_step_, pipeline_schedule_.has_value());

  install_stop_handlers();
  const auto start = Clock::now();
  auto last_save = start;
  double loss = 0;
  for (int64_t step = start_step_; step < steps; ++step) {
    if (checkpointer_) checkpointer_->wait();  // a background save commits at a step boundary
    profile_around_step(step, true);
    StepMetrics m = timed_step(step);
    loss = *m.lm_loss;
    if (evaluation_due(step)) evaluate_validation(step, m);
    if (progress_due(step) && mesh_->world().size() > 1)
      m.peak_memory_max_mb = max_over_ranks(*m.peak_memory_mb);
    const auto log_start = Clock::now();
    log_step(step, m, seconds_since(start));
    host_phases_.log += seconds_since(log_start);
    profile_around_step(step, false);
    // Every rank learns whether any rank was signalled, so all of them stop after this step.
    const bool stop = any_rank_stopping();
    if (stop || checkpoint_due(step + 1, seconds_since(last_save) / 60)) {
      save_checkpoint(step + 1, elapsed_before_ + seconds_since(start));
      last_save = Clock::now();
    }
    if (stop) {
      report_peak_memory();
      report_pipeline_bubble();
      stop_after(step + 1);
      return loss;
    }
  }
  report_peak_memory();
  report_pipeline_bubble();
  write_weights();
  return loss;
}

void Trainer::print_run_header(const model::FlopCount& flops) const {
  std::printf("%s\nmodel %s: %.2fM parameters, %.3g training FLOPs/token\n",
              device_report().c_str(), cfg_.name().c_str(), flops.parameters / 1e6,
              flops.training_per_token);
  std::printf("%s\n", parallel::describe_weight_decay(cfg_.model(), cfg_.optimizer()).c_str());
  const int world = mesh_->world().size();
  if (device_ == Device::CUDA) {
    std::printf("MFU against the GPUs' dense datasheet peak: %.1f TFLOP/s for %d process%s\n",
                peak_flops_ / 1e12, world, world == 1 ? "" : "es");
  } else {
    // The measured SGEMM rate is shown beside the stated peak, never used as MFU's denominator.
    const cpu::CpuPeak peak = cpu::cpu_peak(parallel::launch_info().local_size);
    const double sgemm = measured_peak_flops();
    std::printf("MFU against the CPU's stated peak: %s per process (x%d); SGEMM 1024^3 measured "
                "now: %.1f GFLOP/s, %.0f%% of it\n",
                peak.describe().c_str(), world, sgemm / 1e9, 100 * sgemm / peak.flops());
  }
  const int64_t steps_per_epoch =
      loader_->batches_per_epoch() / std::max<int64_t>(1, cfg_.train().grad_accum());
  std::printf("data %s: %zu training shards, %.4g tokens, %lld batches an epoch (%lld steps; "
              "%.3g epochs in this run); validation %.4g tokens\n",
              data_.dir.c_str(), data_.train.files().size(),
              static_cast<double>(data_.train.tokens()),
              static_cast<long long>(loader_->batches_per_epoch()),
              static_cast<long long>(steps_per_epoch),
              static_cast<double>(cfg_.train().steps()) / static_cast<double>(std::max<int64_t>(1, steps_per_epoch)),
              static_cast<double>(data_.val.tokens()));
  const int zero_stage = config::zero_stage(cfg_.parallel());
  if (pipeline_schedule_)
    std::printf("parallel: %d processes (%s) = pp %d pipeline stages x dp %d x tp %d, %s "
                "schedule, %d model chunk(s) per rank, %d micro-batches (train.grad_accum); the "
                "first stage reads the tokens, the last the targets\n",
                world, parallel::launch_info().source.c_str(), mesh_->dims().pp, mesh_->dims().dp,
                mesh_->dims().tp, parallel::schedule_name(pipeline_schedule_->kind),
                pipeline_schedule_->virtual_stages, pipeline_schedule_->microbatches);
  else if (world > 1)
    std::printf("parallel: %d processes (%s) = dp %d x tp %d (ep %d)%s, %zu gradient buckets\n",
                world, parallel::launch_info().source.c_str(), mesh_->dims().dp, mesh_->dims().tp,
                mesh_->dims().ep,
                zero_stage > 0 ? (", ZeRO stage " + std::to_string(zero_stage)).c_str() : "",
                plan_.dense_buckets ? plan_.dense_buckets->num_buckets() : size_t{0});
}

// The step, with what only the loop knows: its learning rate, throughput and MFU.
StepMetrics Trainer::timed_step(int64_t step) {
  const auto& t = cfg_.train();
  const auto t0 = Clock::now();
  // The peak restarts at every step boundary, so each step reports its own.
  Backend& be = backend(device_);
  be.reset_peak_memory();
  StepMetrics m = train_step(step);
  const size_t peak = be.memory_stats().peak_in_use_bytes;
  peak_memory_bytes_ = std::max(peak_memory_bytes_, peak);
  m.peak_memory_mb = static_cast<double>(peak) / (1 << 20);
  losses_.push_back(*m.lm_loss);
  aux_losses_.push_back(m.aux_loss.value_or(0.0));
  grad_norms_.push_back(m.grad_norm.value_or(0.0));
  const double tokens_per_step =
      static_cast<double>(t.batch_size()) * t.grad_accum() * cfg_.model().seq_len();
  m.tokens_per_s = tokens_per_step / seconds_since(t0);
  m.mfu = flops_per_token_ * *m.tokens_per_s / peak_flops_;
  m.lr = learning_rate(cfg_.optimizer(), step, t.steps());
  return m;
}

// The trace runs on the writing rank only: one table a job, taken from world rank 0's GPU, or
// on a CPU from its main thread's ops.
void Trainer::profile_around_step(int64_t step, bool before) {
  const auto& t = cfg_.train();
  if (t.profile_steps() == 0 || !writer_) return;
  const int64_t first = t.profile_from(), last = first + t.profile_steps() - 1;
  const bool cpu = device_ == Device::CPU;
  if (before && step == first) {
    cpu ? cpu::start_op_trace() : start_device_trace();
    profile_start_ = Clock::now();
    host_phases_ = {};
  }
  if (before || step != last || start_step_ > first) return;
  KernelProfile p = summarize(cpu ? cpu::stop_op_trace() : stop_device_trace(), t.profile_steps());
  p.wall_ms = 1e3 * seconds_since(profile_start_);
  p.cpu_ops = cpu;
  if (cpu) p.sgemm_flops = measured_peak_flops();  // the GEMMs' yardstick, at the same moment
  const std::string csv = run_dir_ + "/kernel_profile.csv";
  write_profile_csv(p, csv);
  if (quiet_) return;
  const double n = 1e3 / t.profile_steps();  // seconds over the window -> ms a step
  const HostPhases& h = host_phases_;
  if (cpu)
    std::printf("%s  (every op: %s)\nthe host a step: loading the batch %.2f ms, the step %.2f "
                "ms, routing statistics %.2f ms, logging %.2f ms\n",
                format_profile(p, 25).c_str(), csv.c_str(), n * h.load, n * (h.enqueue + h.wait),
                n * h.stats, n * h.log);
  else
    std::printf("%s  (every kernel: %s)\nthe host a step: loading the batch %.2f ms, enqueueing "
                "%.2f ms, waiting for the device %.2f ms, routing statistics %.2f ms, logging "
                "%.2f ms\n",
                format_profile(p, 25).c_str(), csv.c_str(), n * h.load, n * h.enqueue, n * h.wait,
                n * h.stats, n * h.log);
}

// metrics.csv and TensorBoard every step; the progress line every train.log_every and last.
void Trainer::log_step(int64_t step, const StepMetrics& m, double run_seconds) const {
  if (log_) log_->write(step + 1, m);
  const int64_t steps = cfg_.train().steps();
  if (quiet_ || !progress_due(step)) return;
  print_progress(step + 1, steps, m, run_seconds / (step + 1 - start_step_) * (steps - step - 1));
}

bool Trainer::progress_due(int64_t step) const {
  return (step + 1) % cfg_.train().log_every() == 0 || step + 1 == cfg_.train().steps();
}

double Trainer::max_over_ranks(double value) const {
  Tensor t = Tensor::from_vector({value}, {1}, DType::F64);
  mesh_->world().all_reduce(t, parallel::ReduceOp::Max);
  return t.data<double>()[0];
}

void Trainer::report_peak_memory() const {
  parallel::Communicator& world = mesh_->world();
  Tensor mine = Tensor::from_vector({static_cast<double>(peak_memory_bytes_)}, {1}, DType::F64);
  Tensor all = Tensor::empty({world.size()}, DType::F64);
  if (world.size() > 1)
    world.all_gather(mine, all);
  else
    all.copy_from(mine);
  if (quiet_ || !writer_) return;
  std::printf("peak memory in use during a step (%s allocator):", device_name(device_));
  for (int r = 0; r < world.size(); ++r)
    std::printf("%s rank %d %s", r ? "," : "", r, model::format_bytes(all.data<double>()[r]).c_str());
  std::printf("\n");
  std::fflush(stdout);
}

// Every train.eval_every steps and after the last.
bool Trainer::evaluation_due(int64_t step) const {
  const auto& t = cfg_.train();
  return t.eval_every() > 0 && ((step + 1) % t.eval_every() == 0 || step + 1 == t.steps());
}

void Trainer::evaluate_validation(int64_t step, StepMetrics& m) const {
  // ZeRO-3: whole while evaluating, since dp ranks may run different numbers of batches.
  const parallel::ParallelPlan::WholeParameters whole(plan_);
  // Every stage evaluates the whole model (after `whole`: its owners' units whole).
  const auto stages = whole_across_stages(/*broadcast=*/true);
  const auto& t = cfg_.train();
  const auto& mc = cfg_.model();
  // Experts over ep: a forward is a collective of dp ranks, so all run as many.
  const bool lockstep = mc.moe().enabled() && mesh_->dims().ep > 1;
  m.val_loss = evaluate(*model_, data_.val, mc.seq_len(), t.batch_size(), t.eval_batches(),
                        model::RoutingMode::TopC, &mesh_->dp(), lockstep)
                   .loss;
  // Causal routing needs a trained decision, and every expert on the rank (MoE's causal path).
  const bool no_decision =
      mc.mod().enabled() && mc.mod().causal().method() == modtrain::CausalRoutingConfig::NONE;
  if (no_decision || lockstep) return;
  if (mc.mod().enabled()) {
    // Every rank routes the same first sequences of the validation split, so all hold the same
    // shares; a few, since causal routing runs sequence by sequence.
    constexpr int64_t kAgreementSequences = 8;
    const auto batch = data::sequential_batches(
        data_.val, mc.seq_len(), std::min<int64_t>(t.batch_size(), kAgreementSequences), 1);
    const auto shares = model::routing_agreement(*model_, batch.at(0).inputs.to(device_));
    for (size_t k = 0, b = 0; b < model_->num_blocks(); ++b)
      if (model_->routed(b)) m.agreement.emplace_back(static_cast<int>(b), shares.at(k++));
  }
  if (step + 1 == t.steps() && (mc.mod().enabled() || mc.moe().enabled()))
    m.val_loss_causal = evaluate(*model_, data_.val, mc.seq_len(), t.batch_size(),
                                 t.eval_batches(), model::RoutingMode::Causal, &mesh_->dp())
                            .loss;
}

void Trainer::write_weights() {
  if (checkpointer_) checkpointer_->wait();
  const auto full = full_parameters();  // collective: every rank gathers
  if (writer_)
    save_weights(run_dir_ + "/model.safetensors", full, cfg_, cfg_.train().steps(),
                 tokenizer_seal());
  if (!quiet_) std::printf("wrote %s/model.safetensors\n", run_dir_.c_str());
}

}  // namespace mod::train
