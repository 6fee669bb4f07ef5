// The pipeline runtime (parallel/pipeline_runtime.h) against one process, at the model level:
// pp = the world size (np2: pp2, np4: pp4), tiny_dense and tiny_mod (predictor), GPipe and
// 1F1B (np4: 1F1B, and GPipe for tiny_dense at 4 micro-batches only, for CI time), 1 and 4
// micro-batches, and (np2) interleaved 1F1B with 2 chunks per rank and 4 micro-batches, 2 AdamW
// steps. Every rank also trains the whole model alone on the same micro-batches. Checked every
// step: the summed losses (lm from the last stage, aux from every stage; to 1e-5, 1e-6, the
// first step's lm bitwise), each routed block's top-C choices per micro-batch, bitwise; each
// owned parameter's gradient (bitwise in the first step of one micro-batch, the tied embedding
// aside; else to a relative 1e-5 in norm: the tied embedding's halves are summed per stage);
// no gradient on the parameters a stage does not own; the gradient norm summed over stages
// (1e-5); the parameters after the last step.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "configs/config.h"
#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/random.h"
#include "parallel/adamw.h"
#include "parallel/pipeline_runtime.h"
#include "parallel/world.h"

using namespace mod;

namespace {
double relative_norm_diff(const Tensor& a, const Tensor& b) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff += (a.at(i) - b.at(i)) * (a.at(i) - b.at(i));
    norm += b.at(i) * b.at(i);
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void check_pipeline(const std::string& recipe, parallel::PipelineScheduleKind kind, int m) {
  const bool interleaved = kind == parallel::PipelineScheduleKind::Interleaved1F1B;
  const int v = interleaved ? 2 : 1;
  auto& world = parallel::world();
  const int pp = world.size(), rank = world.rank();
  const char* src = std::getenv("MOD_SOURCE_DIR");
  const modtrain::RunConfig cfg = config::load(
      std::string(src ? src : MOD_SOURCE_DIR) + "/configs/recipes/" + recipe + ".textproto",
      {"model.seq_len=64", "parallel.pp=" + std::to_string(pp), "train.grad_accum=" + std::to_string(m),
       "parallel.virtual_stages=" + std::to_string(v),
       interleaved ? "parallel.pp_schedule=INTERLEAVED_1F1B" : "parallel.pp_schedule=ONE_F_ONE_B"});
  const parallel::PipelinePartition part = parallel::plan_partition(cfg);
  const parallel::PipelineSchedule sched = parallel::make_schedule(kind, pp, m, v);
  model::Transformer ref(cfg.model(), cfg.train().seed()), stage(cfg.model(), cfg.train().seed());
  parallel::AdamW ref_opt(ref.named_parameters(), cfg.optimizer());
  parallel::AdamW stage_opt(stage.named_parameters(), cfg.optimizer());
  const auto tied = parallel::make_tied_embedding_group(world);
  const bool tie = cfg.model().tie_embeddings();
  Rng rng(52);
  const int64_t vocab = cfg.model().vocab_size();
  for (int step = 0; step < 2; ++step) {
    INFO(recipe << " " << parallel::schedule_name(kind) << " pp " << pp << " m " << m << " step "
                << step + 1 << " rank " << rank);
    std::vector<parallel::PipelineMicroBatch> mbs;
    for (int i = 0; i < m; ++i) {
      std::vector<int64_t> tok(2 * 64), tgt(2 * 64);
      for (auto& x : tok) x = rng.below(vocab);
      for (auto& x : tgt) x = rng.below(vocab);
      mbs.push_back({Tensor::from_indices(tok, {2, 64}), Tensor::from_indices(tgt, {2, 64})});
    }
    // One process: gradient accumulation over the same micro-batches.
    ref.zero_grad();
    double ref_lm = 0, ref_aux = 0;
    std::vector<model::ForwardResult> ref_results;
    for (const auto& mb : mbs) {
      model::ForwardResult r = ref.forward(mb.tokens, mb.targets);
      backward(scale(r.loss, 1.0 / m));
      // As the trainer accumulates (Backend::axpy: += (1/m) x).
      ref_lm += (1.0 / m) * detach(r.lm_loss).to(DType::F64).item();
      if (r.aux_loss.defined()) ref_aux += (1.0 / m) * detach(r.aux_loss).to(DType::F64).item();
      ref_results.push_back(std::move(r));
    }
    stage.zero_grad();
    const parallel::StageStep st = parallel::run_stage_step(stage, sched, part, world, mbs);
    parallel::sum_tied_embedding_grads(stage, tied.get());

    Tensor losses = Tensor::from_vector(
        std::vector<double>{st.lm_loss.item(), st.aux_loss.item()}, {2}, DType::F64);
    world.all_reduce(losses);
    // The first step's LM loss comes from the same parameters: bitwise. The aux losses are
    // f32 scalars summed in another order (per stage, then over stages): f32 rounding.
    if (step == 0)
      CHECK(losses.at(0) == ref_lm);
    else
      CHECK(std::abs(losses.at(0) - ref_lm) <= 1e-5 * std::abs(ref_lm));
    CHECK(std::abs(losses.at(1) - ref_aux) <= 1e-6 * std::max(1.0, std::abs(ref_aux)));
    for (int i = 0; i < m; ++i) {
      const auto& mine = st.results[i];
      REQUIRE(mine.stats.size() == mine.routed_idx.size());
      size_t k = 0;
      for (size_t j = 0; j < ref_results[i].stats.size(); ++j) {
        const int block = ref_results[i].stats[j].block;
        if (part.rank_of(part.stage_of_block(block)) != rank) continue;
        INFO("micro-batch " << i << " block " << block);
        REQUIRE(k < mine.routed_idx.size());
        CHECK(mine.stats[k].block == block);
        CHECK(same_bits(mine.routed_idx[k], ref_results[i].routed_idx[j]));
        ++k;
      }
      CHECK(k == mine.routed_idx.size());
    }
    const auto ref_params = ref.named_parameters(), stage_params = stage.named_parameters();
    double ref_sq = 0;
    for (const auto& [name, p] : ref_params)
      for (int64_t k = 0; k < p.grad().numel(); ++k) ref_sq += p.grad().at(k) * p.grad().at(k);
    CHECK(std::abs(parallel::pipeline_grad_norm(stage, part, world) - std::sqrt(ref_sq)) <=
          1e-5 * std::sqrt(ref_sq));
    for (size_t i = 0; i < ref_params.size(); ++i) {
      const auto& [name, p] = stage_params[i];
      INFO(name);
      if (!parallel::stage_owns(part, rank, name, tie)) {
        CHECK_FALSE(p.grad().defined());
        continue;
      }
      REQUIRE(p.grad().defined());
      const Tensor& want = ref_params[i].second.grad();
      // Bitwise where every sum runs in one process's order: the first step (later ones start
      // from parameters the tied embedding's rounding moved) of one micro-batch, except the
      // tied embedding (one process scatter-adds the lookup's rows into the head's gradient).
      if (m == 1 && step == 0 && !(tie && name == "embed.weight"))
        CHECK(same_bits(p.grad(), want));
      else
        CHECK(relative_norm_diff(p.grad(), want) <= 1e-5);
    }
    ref_opt.step(1e-3);
    stage_opt.step(1e-3);
  }
  const auto ref_params = ref.named_parameters(), stage_params = stage.named_parameters();
  for (size_t i = 0; i < ref_params.size(); ++i) {
    const auto& [name, p] = stage_params[i];
    if (!parallel::stage_owns(part, rank, name, tie)) continue;
    INFO(recipe << " final " << name << " rank " << rank);
    CHECK(relative_norm_diff(p, ref_params[i].second) <= 1e-5);
  }
}

// Every rank also trains the reference, so np4 costs twice np2 on two cores: 1F1B alone there.
std::vector<parallel::PipelineScheduleKind> schedules() {
  if (parallel::world().size() > 2) return {parallel::PipelineScheduleKind::OneFOneB};
  return {parallel::PipelineScheduleKind::GPipe, parallel::PipelineScheduleKind::OneFOneB};
}
}  // namespace

TEST_CASE("pipeline: tiny_dense stages equal one process step by step", "[mpi][parity]") {
  if (parallel::world().size() < 2) {
    WARN("needs 2 or more processes (pp = world size)");
    return;
  }
  for (auto kind : schedules())
    for (int m : {1, 4}) check_pipeline("tiny_dense", kind, m);
  // Interleaved, 2 chunks of the 6 blocks per rank (np2 only: pp 4 x 2 would need 8 blocks).
  if (parallel::world().size() == 2)
    check_pipeline("tiny_dense", parallel::PipelineScheduleKind::Interleaved1F1B, 4);
  // GPipe at pp 4 too, where every stage holds all 4 micro-batches in flight (one case for time).
  if (parallel::world().size() == 4)
    check_pipeline("tiny_dense", parallel::PipelineScheduleKind::GPipe, 4);
}

TEST_CASE("pipeline: tiny_mod stages equal one process step by step", "[mpi][parity]") {
  if (parallel::world().size() < 2) {
    WARN("needs 2 or more processes (pp = world size)");
    return;
  }
  for (auto kind : schedules())
    for (int m : {1, 4}) check_pipeline("tiny_mod", kind, m);
  if (parallel::world().size() == 2)
    check_pipeline("tiny_mod", parallel::PipelineScheduleKind::Interleaved1F1B, 4);
}
