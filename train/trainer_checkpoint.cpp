// The trainer's checkpoints: what a save holds, when it happens, stopping on a signal, and
// resuming under any layout.
// Tensors are saved by their global names and shapes: model/<param>, optim/m/<param> and
// optim/v/<param>, tensor-parallel slices as pieces of the global tensor, written by dp rank 0
// (its dp replicas are identical); under pp, by the stage that owns them. ZeRO-1 moments are gathered over dp first, so the files do
// not depend on dp or ZeRO-1 and a resume under another layout just reads other slices.
#include <cstdio>
#include <optional>
#include <stdexcept>

#include "configs/config.h"
#include "core/random.h"
#include "core/util/safetensors.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/reader.h"
#include "parallel/pipeline_runtime.h"
#include "train/hf/import.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

namespace mod::train {

namespace {
ckpt::TensorEntry entry(const std::string& name, const Tensor& local,
                        const parallel::ShardSpec& spec, bool writer) {
  // Files are written from host memory: a GPU tensor is copied (a snapshot, so a background
  // save may outlive the step).
  return {name, local.to(Device::CPU), spec.global_shape, spec.dim, spec.offset, writer};
}

// This rank's slice of a global tensor as the spec places it.
Tensor local_slice(const Tensor& full, const parallel::ShardSpec& spec, const Shape& local_shape) {
  return spec.dim < 0 ? full : parallel::slice_dim(full, spec.dim, spec.offset, local_shape[spec.dim]);
}
}  // namespace

std::vector<ckpt::TensorEntry> Trainer::checkpoint_entries() {
  // One writer per piece: dp rank 0 for tp shards, tp rank 0 of it for replicated tensors, and
  // for experts the first rank of their expert data-parallel group (edp holds their replicas).
  const bool dp_writer = mesh_->dp_rank() == 0, tp_writer = dp_writer && mesh_->tp_rank() == 0;
  const bool expert_writer = mesh_->edp().rank() == 0;
  // Under pp each stage writes the tensors it owns (the tied embedding: the first stage).
  auto stage_writes = [&](const std::string& name) {
    return !pipeline_partition_ || parallel::stage_owns(*pipeline_partition_, mesh_->pp_rank(),
                                                        name, /*tie_embeddings=*/false);
  };
  std::vector<ckpt::TensorEntry> out;
  const auto params = model_->named_parameters();
  const parallel::ParallelPlan::WholeParameters whole(plan_);  // ZeRO-3: the entries copy them
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const parallel::ShardSpec& spec = plan_.shards.at(name);
    const bool writer =
        (spec.expert ? expert_writer : spec.dim >= 0 ? dp_writer : tp_writer) && stage_writes(name);
    // ZeRO-3 lets the whole tensor go when `whole` ends: the entry keeps a copy. Another
    // stage's parameter has no bytes here (release_other_stages), and its owner writes it.
    // Its moments likewise: the stage's optimizer holds only its own.
    if (pipeline_partition_ && !parallel::stage_owns(*pipeline_partition_, mesh_->pp_rank(), name,
                                                     cfg_.model().tie_embeddings()))
      continue;
    out.push_back(entry("model/" + name, whole.units ? p.clone() : p, spec, writer));
    const auto [m, v] = plan_.optimizer->full_moments(i);  // collective under ZeRO-1
    out.push_back(entry("optim/m/" + name, m, spec, writer));
    out.push_back(entry("optim/v/" + name, v, spec, writer));
  }
  return out;
}

std::optional<uint32_t> Trainer::tokenizer_seal() const {
  if (!data_.manifest.has_tokenizer_crc32c()) return std::nullopt;
  return data_.manifest.tokenizer_crc32c();
}

const std::vector<data::ShardFingerprint>& Trainer::data_fingerprint() {
  if (data_fingerprint_.empty()) data_fingerprint_ = data_.train_fingerprint();
  return data_fingerprint_;
}

void Trainer::save_checkpoint(int64_t steps_done, double elapsed) {
  if (!checkpointer_) checkpointer_ = std::make_unique<ckpt::Checkpointer>(run_dir_, mesh_->world());
  ckpt::TrainState st;
  st.config = cfg_;
  st.step = steps_done;
  st.tokens_seen = steps_done * cfg_.train().batch_size() * cfg_.train().grad_accum() * cfg_.model().seq_len();
  const data::LoaderState ls = loader_->state();
  st.loader_seed = ls.seed;
  st.batches_drawn = ls.batches_drawn;
  st.data_shards = data_fingerprint();
  st.tokenizer_crc32c = tokenizer_seal();
  const auto words = Rng(cfg_.train().seed()).state();  // init stream; training draws no randomness
  st.rng_state.assign(words.begin(), words.end());
  st.mesh = {mesh_->dims().dp, mesh_->dims().tp, config::zero_stage(cfg_.parallel()),
             mesh_->world().size(), mesh_->dims().pp};
  st.elapsed_seconds = elapsed;
  st.last_metrics_step = steps_done;
  st.optimizer_steps = plan_.optimizer->steps_taken();
  ckpt::SaveOptions options = ckpt::save_options(cfg_.checkpoint());
  options.fault = hooks_.checkpoint_fault;
  checkpointer_->save(checkpoint_entries(), st, options);
  if (!quiet_ && !checkpointer_->pending())
    std::printf("checkpoint %s\n", checkpointer_->last_committed().value_or("?").c_str());
}

bool Trainer::checkpoint_due(int64_t steps_done, double minutes_since_save) {
  const auto& c = cfg_.checkpoint();
  if (c.every_steps() <= 0 && c.every_minutes() <= 0) return false;
  if (steps_done == cfg_.train().steps()) return true;
  // Clocks differ between ranks: rank 0's reading decides for everyone.
  Tensor due = Tensor::scalar(
      (c.every_steps() > 0 && steps_done % c.every_steps() == 0) ||
              (c.every_minutes() > 0 && minutes_since_save >= c.every_minutes())
          ? 1.0 : 0.0,
      DType::I32);
  mesh_->world().broadcast(due, 0);
  return due.item() != 0;
}

bool Trainer::any_rank_stopping() {
  Tensor flag = Tensor::scalar(stop_signal_received() != 0 ? 1.0 : 0.0, DType::I32);
  mesh_->world().all_reduce(flag, parallel::ReduceOp::Max);
  return flag.item() != 0;
}

// After the stop's checkpoint is committed: the run ends with kExitCheckpointedStop.
void Trainer::stop_after(int64_t steps_done) {
  if (checkpointer_) checkpointer_->wait();
  stopped_ = true;
  if (!quiet_)
    std::printf(
        "stopping after step %lld on SIGTERM/SIGUSR1: checkpoint written, exit %d; "
        "continue with --resume auto\n",
        static_cast<long long>(steps_done), kExitCheckpointedStop);
}

void Trainer::resume(const std::string& spec) {
  std::optional<std::string> dir;
  if (spec == "auto") {
    dir = ckpt::find_latest(run_dir_);
    if (!dir) {
      if (!quiet_) std::printf("resume auto: no checkpoint in %s, starting from step 0\n", run_dir_.c_str());
      return;
    }
  } else {
    dir = ckpt::resolve_checkpoint(spec);
  }
  ckpt::CheckpointReader reader(*dir);
  reader.check_compatible(cfg_);
  const ckpt::TrainState& st = reader.state();
  if (st.step >= cfg_.train().steps())
    throw std::invalid_argument("resume: checkpoint " + *dir + " is at step " + std::to_string(st.step) +
                                ", not before train.steps " + std::to_string(cfg_.train().steps()) +
                                " (raise train.steps to train further)");
  const auto params = model_->named_parameters();
  // ZeRO-3: loaded whole, then each rank keeps its slices when `whole` ends; pp: the other
  // stages' parameters too, released again when `stages` ends (before `whole`).
  std::optional<parallel::ParallelPlan::WholeParameters> whole(std::in_place, plan_);
  std::optional<parallel::OtherStagesWhole> stages(std::in_place, *model_,
                                                   pipeline_partition_ ? &*pipeline_partition_ : nullptr,
                                                   mesh_->pp(), cfg_.model().tie_embeddings(),
                                                   /*broadcast=*/false,
                                                   hooks_.keep_other_stages_parameters);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const parallel::ShardSpec& s = plan_.shards.at(name);
    auto read = [&](const std::string& key) {
      return reader.read(key, p.shape(), s.dim, s.offset, p.dtype());
    };
    Tensor dst = p;
    dst.copy_from(read("model/" + name));
    const Tensor m = read("optim/m/" + name), v = read("optim/v/" + name);
    plan_.optimizer->load_moments(i, m, v);
  }
  stages.reset();
  whole.reset();
  plan_.optimizer->set_steps_taken(st.optimizer_steps);
  if (!st.data_shards.empty())
    data::check_same_shards(st.data_shards, data_fingerprint(), "resume: checkpoint " + *dir);
  if (tokenizer_seal())  // Dataset::open checked the file against the manifest's seal
    data::check_tokenizer_seal(data_.tokenizer_path(), *tokenizer_seal(),
                               "resume: checkpoint " + *dir, st.tokenizer_crc32c);
  loader_->restore({st.loader_seed, st.batches_drawn});
  start_step_ = st.step;
  elapsed_before_ = st.elapsed_seconds;
  if (!quiet_)
    std::printf("resumed from %s: step %lld, saved under dp %d x tp %d x pp %d%s\n", dir->c_str(),
                static_cast<long long>(st.step), st.mesh.dp, st.mesh.tp, st.mesh.pp,
                st.mesh.zero_stage > 0 ? (" (ZeRO stage " + std::to_string(st.mesh.zero_stage) + ")").c_str()
                                       : "");
}

void Trainer::init_from(const std::string& path) {
  if (hf::is_hf_dir(path)) {
    if (!hf::is_modtrain_dir(path)) return init_from_hf(path);
    return init_from(path + "/model.safetensors");  // ModtrainForCausalLM: modtrain's names
  }
  SafetensorsFile file = load_safetensors(path);
  const parallel::ParallelPlan::WholeParameters whole(plan_);
  const auto stages = whole_across_stages(/*broadcast=*/false);  // every rank reads every tensor
  for (const auto& [name, p] : model_->named_parameters()) {
    const parallel::ShardSpec& s = plan_.shards.at(name);
    auto it = file.tensors.find(name);
    if (it == file.tensors.end()) throw std::runtime_error("init from " + path + ": missing tensor " + name);
    if (it->second.shape() != s.global_shape)
      throw std::runtime_error("init from " + path + ": tensor " + name + " has shape " +
                               shape_str(it->second.shape()) + ", the model expects " +
                               shape_str(s.global_shape));
    Tensor dst = p;
    dst.copy_from(local_slice(it->second.to(p.dtype()), s, p.shape()));
  }
  if (file.tensors.size() != plan_.shards.size())
    throw std::runtime_error("init from " + path + ": " + std::to_string(file.tensors.size()) +
                             " tensors, the model has " + std::to_string(plan_.shards.size()) + " parameters");
}

// A Hugging Face Llama directory: its dense weights; MoD's routers and predictors keep the
// initialisation the model was built with (docs/hf.md, "Converting a dense model to MoD").
void Trainer::init_from_hf(const std::string& dir) {
  std::map<std::string, Tensor> weights = hf::read_llama(dir, cfg_.model());
  const parallel::ParallelPlan::WholeParameters whole(plan_);
  const auto stages = whole_across_stages(/*broadcast=*/false);
  int64_t fresh = 0;
  for (const auto& [name, p] : model_->named_parameters()) {
    const parallel::ShardSpec& s = plan_.shards.at(name);
    const auto it = weights.find(name);
    if (it == weights.end()) {
      ++fresh;
      continue;
    }
    Tensor dst = p;
    dst.copy_from(local_slice(it->second.to(p.dtype()), s, p.shape()));
  }
  if (!quiet_)
    std::printf("init from %s (LlamaForCausalLM): %zu tensors loaded, %lld MoD router/predictor "
                "tensors start fresh\n",
                dir.c_str(), weights.size(), static_cast<long long>(fresh));
}

}  // namespace mod::train
