// The optimizer interface (parallel/optimizer.h), run as a world of one and under mpirun -n 2:
// ZeRO-1 (dense moments sharded over the world, experts' over a group of one) updates every
// parameter bitwise as AdamW does when every rank holds the same gradients, and moments taken
// out of either (full_moments) and loaded into the other continue bitwise alike: what resuming a
// checkpoint under another layout relies on. Parameter sizes do not divide by 2, so the shards
// are uneven. Checks are CHECK, never REQUIRE, so a failure cannot desynchronise the ranks.
// The fusions (OptimizerFusion): tiny models trained with the multi-tensor update and weight
// copies, f64 standing in for bf16 as in tests/model/autocast_test.cpp, equal the unfused runs
// bitwise, through AdamW and ZeRO-1, across a resume, and on the emulated device with the step
// captured and replayed as a CUDA graph.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/random.h"
#include "core/weight_copy.h"
#include "model/transformer.h"
#include "parallel/adamw.h"
#include "parallel/world.h"
#include "parallel/zero1.h"
#include "tests/support/emulated_cuda.h"
#include "tests/support/tiny_configs.h"

using namespace mod;
using namespace mod::parallel;

namespace {

using Named = std::vector<std::pair<std::string, Tensor>>;
// name, shape, expert weight: decayed and not (norm, bias) dense parameters and one expert.
const std::vector<std::tuple<std::string, Shape, bool>> kParams = {
    {"blocks.0.attn.wq.weight", {7, 5}, false},
    {"blocks.0.norm1.weight", {5}, false},
    {"blocks.0.mlp.up.bias", {3}, false},
    {"blocks.0.mlp.experts.up", {2, 3, 3}, true}};

modtrain::OptimizerConfig adamw_config() {
  modtrain::OptimizerConfig c;
  c.set_beta1(0.9);
  c.set_beta2(0.95);
  c.set_eps(1e-8);
  c.set_weight_decay(0.1);
  return c;
}

// The same parameters on every rank and for every optimizer (seeded), gradients unset.
Named make_params() {
  Rng rng(11);
  Named out;
  for (const auto& [name, shape, expert] : kParams) out.emplace_back(name, randn(shape, rng));
  return out;
}

// Step `step`'s gradients, the same on every rank: backward of sum(p * g) leaves g in p.grad().
void set_grads(Named& params, int step) {
  Rng rng(100 + step);
  for (auto& [name, p] : params) {
    p.zero_grad();
    p.set_requires_grad(true);
    sum(mul(p, randn(p.shape(), rng))).backward();
  }
}

std::unique_ptr<Optimizer> make_zero1(const Named& params, Communicator& dp, Communicator& edp) {
  std::vector<ShardedAdamW::Param> zp;
  std::vector<bool> expert;
  for (size_t i = 0; i < params.size(); ++i) {
    zp.push_back(
        {params[i].first, params[i].second, takes_weight_decay(params[i].first, adamw_config())});
    expert.push_back(std::get<2>(kParams[i]));
  }
  return std::make_unique<Zero1Optimizer>(zp, expert, adamw_hyper(adamw_config()), dp, edp);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector() == b.to_vector();
}

// Parameters, moments (collective) and step counts of the two optimizers agree bitwise.
void check_same(const Named& pa, Optimizer& a, const Named& pb, Optimizer& b) {
  CHECK(a.steps_taken() == b.steps_taken());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(bitwise_equal(pa[i].second, pb[i].second));
    const auto [ma, va] = a.full_moments(i);
    const auto [mb, vb] = b.full_moments(i);
    CHECK(bitwise_equal(ma, mb));
    CHECK(bitwise_equal(va, vb));
  }
}

// One update through the interface: step(lr) on even steps, the halves with a gradient scale
// (a clipping factor) on odd ones.
void update(Named& params, Optimizer& opt, int step) {
  set_grads(params, step);
  if (step % 2 == 0) {
    opt.step(1e-2);
    return;
  }
  opt.set_learning_rate(5e-3);
  opt.apply(Tensor::full({}, 0.5, DType::F32));
}

}  // namespace

TEST_CASE("ZeRO-1 through the Optimizer interface updates bitwise as AdamW", "[mpi]") {
  Communicator& world = parallel::world();
  auto group_of_one = make_local_communicator();
  Named pa = make_params(), pb = make_params();
  std::unique_ptr<Optimizer> adamw = std::make_unique<AdamW>(pa, adamw_config());
  std::unique_ptr<Optimizer> zero1 = make_zero1(pb, world, *group_of_one);
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step + 1 << " on world rank " << world.rank() << " of " << world.size());
    update(pa, *adamw, step);
    update(pb, *zero1, step);
    check_same(pa, *adamw, pb, *zero1);
  }
}

TEST_CASE("moments moved between AdamW and ZeRO-1 continue bitwise alike", "[mpi]") {
  Communicator& world = parallel::world();
  auto group_of_one = make_local_communicator();
  Named pa = make_params(), pb = make_params();
  AdamW adamw(pa, adamw_config());
  std::unique_ptr<Optimizer> zero1 = make_zero1(pb, world, *group_of_one);
  for (int step = 0; step < 2; ++step) {
    update(pa, adamw, step);
    update(pb, *zero1, step);
  }
  // A fresh optimizer of the other kind over copies of the parameters, given the saved state.
  auto resumed = [](const Named& from_params, Optimizer& from, Named& to_params, Optimizer& to) {
    for (size_t i = 0; i < from_params.size(); ++i) {
      to_params[i].second.copy_from(from_params[i].second);
      const auto [m, v] = from.full_moments(i);
      to.load_moments(i, m, v);
    }
    to.set_steps_taken(from.steps_taken());
  };
  Named pz = make_params(), pw = make_params();
  std::unique_ptr<Optimizer> zero1_from_adamw = make_zero1(pz, world, *group_of_one);
  AdamW adamw_from_zero1(pw, adamw_config());
  resumed(pa, adamw, pz, *zero1_from_adamw);
  resumed(pb, *zero1, pw, adamw_from_zero1);
  for (int step = 2; step < 4; ++step) {
    INFO("step " << step + 1 << " on world rank " << world.rank());
    for (auto [params, opt] : {std::pair{&pa, static_cast<Optimizer*>(&adamw)},
                               {&pz, zero1_from_adamw.get()},
                               {&pb, zero1.get()},
                               {&pw, static_cast<Optimizer*>(&adamw_from_zero1)}})
      update(*params, *opt, step);
    check_same(pa, adamw, pz, *zero1_from_adamw);
    check_same(pa, adamw, pw, adamw_from_zero1);
    check_same(pa, adamw, pb, *zero1);
  }
}

namespace {

struct TinyRun {
  std::vector<double> losses;  // one per step
  std::vector<Tensor> params;  // at the end, on the host
};

struct TinyRunOptions {
  bool fused = false;   // multi-tensor update and weight copies (f64 for the f32 masters)
  bool zero1 = false;   // ZeRO-1 over the world (every rank the same batch) instead of AdamW
  int resume_at = -1;   // after this many steps: state saved, two steps thrown away, reloaded
  Device device = Device::CPU;
  bool capture = false;  // device: steps after the first replay one captured step
};

// A tiny recipe trained for `steps` steps on one fixed batch under AutocastGuard(F64); every
// step's gradients scaled by 0.5 (a clip factor) and a learning rate varying by step.
TinyRun train_tiny(const modtrain::ModelConfig& cfg, int steps, const TinyRunOptions& o) {
  model::Transformer model(cfg, 3, DType::F32);
  model.to(o.device);
  const auto named = model.named_parameters();
  OptimizerFusion fusion;
  fusion.multi_tensor = o.fused;
  if (o.fused) fusion.weight_copies = DType::F64;
  auto group_of_one = make_local_communicator();
  std::unique_ptr<Optimizer> opt;
  if (o.zero1) {
    std::vector<ShardedAdamW::Param> zp;
    for (const auto& [name, t] : named) zp.push_back({name, t, takes_weight_decay(name, adamw_config())});
    opt = std::make_unique<Zero1Optimizer>(zp, std::vector<bool>(zp.size(), false),
                                           adamw_hyper(adamw_config()), parallel::world(),
                                           *group_of_one, fusion);
  } else {
    opt = std::make_unique<AdamW>(named, adamw_config(), fusion);
  }
  std::vector<int64_t> ids(2 * 12), next(2 * 12);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7 + 3) % 32);
    next[i] = static_cast<int64_t>((i * 5 + 1) % 32);
  }
  const Tensor inputs = Tensor::from_indices(ids, {2, 12}).to(o.device);
  const Tensor targets = Tensor::from_indices(next, {2, 12}).to(o.device);
  const Tensor scale = Tensor::full({}, 0.5, DType::F32).to(o.device);
  auto enqueue = [&] {
    model.zero_grad();
    model::ForwardResult r;
    {
      AutocastGuard f64(DType::F64);
      r = model.forward(inputs, targets);
    }
    backward(r.loss);
    opt->apply(scale);
    return detach(r.loss);
  };
  TinyRun run;
  std::unique_ptr<CapturedWork> graph;
  Tensor graph_loss;
  std::vector<Tensor> saved;
  std::vector<std::pair<Tensor, Tensor>> moments;
  for (int step = 0; step < steps; ++step) {
    if (step == o.resume_at) {
      saved.clear();
      moments.clear();
      for (size_t i = 0; i < named.size(); ++i) {
        saved.push_back(named[i].second.clone());
        const auto [m, v] = opt->full_moments(i);  // AdamW's own tensors: kept as they are now
        moments.emplace_back(m.clone(), v.clone());
      }
      for (int k = 0; k < 2; ++k) {
        opt->set_learning_rate(0.05);
        enqueue();
      }
      for (size_t i = 0; i < named.size(); ++i) {
        Tensor p = named[i].second;
        p.copy_from(saved[i]);
        opt->load_moments(i, moments[i].first, moments[i].second);
      }
      opt->set_steps_taken(step);
    }
    opt->set_learning_rate(1e-2 * (1 + step % 3));
    if (!o.capture || step == 0) {
      run.losses.push_back(enqueue().item());
      continue;
    }
    if (!graph) {
      Backend& be = backend(o.device);
      be.begin_capture();
      graph_loss = enqueue();
      graph = be.end_capture();
    }
    graph->replay();
    run.losses.push_back(graph_loss.item());
  }
  for (const auto& [name, p] : named) run.params.push_back(p.to(Device::CPU));
  return run;
}

void check_same_run(const TinyRun& a, const TinyRun& b) {
  CHECK(a.losses == b.losses);
  REQUIRE(a.params.size() == b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    INFO("parameter " << i);
    CHECK(bitwise_equal(a.params[i], b.params[i]));
  }
}

}  // namespace

TEST_CASE("weight copies and the multi-tensor update train tiny models bitwise as unfused AdamW",
          "[mpi]") {
  for (bool mod : {false, true}) {
    INFO((mod ? "tiny_mod" : "tiny_dense"));
    const auto cfg = test::tiny_model(mod);
    const TinyRun unfused = train_tiny(cfg, 4, {});
    CHECK(unfused.losses.back() < unfused.losses.front());
    TinyRunOptions fused;
    fused.fused = true;
    check_same_run(unfused, train_tiny(cfg, 4, fused));
    // A resume writes every master (copy_from): each copy must be rewritten before it is read.
    TinyRunOptions resumed = fused;
    resumed.resume_at = 2;
    check_same_run(unfused, train_tiny(cfg, 4, resumed));
  }
}

TEST_CASE("ZeRO-1 with the fusions trains bitwise as unfused AdamW, resume included", "[mpi]") {
  const auto cfg = test::tiny_model(true);
  const TinyRun unfused = train_tiny(cfg, 4, {});
  TinyRunOptions zero1;
  zero1.zero1 = true;
  zero1.fused = true;
  check_same_run(unfused, train_tiny(cfg, 4, zero1));
  zero1.resume_at = 2;
  check_same_run(unfused, train_tiny(cfg, 4, zero1));
}

TEST_CASE("a captured step with weight copies replays bitwise as unfused CPU steps (emulated "
          "device)",
          "[mpi]") {
  test::emulate_cuda();
  for (bool mod : {false, true}) {
    INFO((mod ? "tiny_mod" : "tiny_dense"));
    const auto cfg = test::tiny_model(mod);
    const TinyRun cpu = train_tiny(cfg, 4, {});
    TinyRunOptions device;
    device.fused = true;
    device.device = Device::CUDA;
    check_same_run(cpu, train_tiny(cfg, 4, device));
    device.capture = true;
    const int captures = test::emulate_cuda().captures();
    check_same_run(cpu, train_tiny(cfg, 4, device));
    CHECK(test::emulate_cuda().captures() == captures + 1);
  }
}
