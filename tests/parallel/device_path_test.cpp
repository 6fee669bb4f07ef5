// train.device CUDA in one process on the emulated device (tests/support/emulated_cuda.h):
// parameters moved after init, batches and index tensors copied over, optimizer state and
// gradient buffers allocated beside the parameters, checkpoints copied to the host. Losses and
// parameters must equal the CPU run's bitwise; checkpoints written on the device resume on the
// CPU and back. The real kernels are compared with the CPU's in tests/cuda (on machines with a
// GPU); several processes on the device are in device_parallel_test.cpp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <utility>

#include "core/autograd.h"
#include "model/sampler.h"
#include "model/transformer.h"
#include "tests/support/bitwise.h"
#include "tests/support/emulated_cuda.h"
#include "tests/support/tiny_runs.h"
#include "train/checkpoint/checkpoint.h"

namespace mod {
namespace {

using test::emulate_cuda;

constexpr int kSteps = 8;

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;
  std::string dir;
};

Run train_run(const std::string& recipe, bool on_device, const std::string& resume_from = "",
              std::vector<std::string> extra = {}) {
  emulate_cuda();
  // Eager unless a case asks for the graph (one process on CUDA graphs by default).
  if (on_device) extra.insert(extra.begin(), "train.cuda_graph=false");
  extra.push_back(std::string("train.device=") + (on_device ? "CUDA" : "CPU"));
  extra.push_back("checkpoint.every_steps=4");
  const auto cfg = test::tiny_recipe(recipe, kSteps, "", extra);
  Run r;
  r.dir = test::temp_dir("device_run");
  auto local = parallel::make_local_communicator();
  train::Trainer trainer(cfg, r.dir, /*quiet=*/true, *local);
  if (!resume_from.empty()) trainer.resume(resume_from);
  trainer.run();
  r.losses = trainer.losses();
  r.params = trainer.full_parameters();
  return r;
}

void require_same(const Run& device, const Run& cpu, size_t first_step = 0) {
  REQUIRE(device.losses.size() + first_step == cpu.losses.size());
  for (size_t s = 0; s < device.losses.size(); ++s) {
    INFO("step " << first_step + s + 1);
    CHECK(device.losses[s] == cpu.losses[first_step + s]);
  }
  REQUIRE(device.params.size() == cpu.params.size());
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    INFO(cpu.params[i].first);
    const Tensor& d = device.params[i].second;
    CHECK(d.device() == Device::CUDA);
    test::check_bitwise(d.to_vector(), cpu.params[i].second.to_vector());
  }
}

std::string checkpoint_at(const Run& r, int step) {
  return ckpt::checkpoints_dir(r.dir) + "/" + ckpt::step_dir_name(step);
}
}  // namespace

// One case a recipe, so that CTest can run them as separate entries (tests/CMakeLists.txt).
static void require_trains_as_cpu(const char* recipe) {
  INFO(recipe);
  const Run cpu = train_run(recipe, false);
  const Run device = train_run(recipe, true);
  require_same(device, cpu);
}

TEST_CASE("train.device CUDA trains tiny_dense exactly as the CPU (emulated device)",
          "[device][dense]") {
  require_trains_as_cpu("tiny_dense");
}

TEST_CASE("train.device CUDA trains tiny_mod exactly as the CPU (emulated device)",
          "[device][mod]") {
  require_trains_as_cpu("tiny_mod");
}

TEST_CASE("train.device CUDA trains the MoDE recipes exactly as the CPU (emulated device)",
          "[device][mode]") {
  require_trains_as_cpu("tiny_mode_integrated");
  require_trains_as_cpu("tiny_mode_staged");
}

TEST_CASE("a causal-routing MoD model with the predictor trains on the device as on the CPU",
          "[device][mod]") {
  const std::vector<std::string> aux = {"model.mod.causal.method=AUX_BCE"};
  require_same(train_run("tiny_mod", true, "", aux), train_run("tiny_mod", false, "", aux));
}

TEST_CASE("checkpoints written on the device resume on the CPU, and the reverse",
          "[device][checkpoints]") {
  const Run device = train_run("tiny_mod", true);
  const Run cpu = train_run("tiny_mod", false);
  const Run cpu_from_device = train_run("tiny_mod", false, checkpoint_at(device, 4));
  const Run device_from_cpu = train_run("tiny_mod", true, checkpoint_at(cpu, 4));
  REQUIRE(cpu_from_device.losses.size() == static_cast<size_t>(kSteps - 4));
  for (size_t s = 0; s < cpu_from_device.losses.size(); ++s) {
    INFO("step " << 5 + s);
    CHECK(cpu_from_device.losses[s] == cpu.losses[4 + s]);
    CHECK(device_from_cpu.losses[s] == cpu.losses[4 + s]);
  }
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    INFO(cpu.params[i].first);
    test::check_bitwise(cpu_from_device.params[i].second.to_vector(),
                        cpu.params[i].second.to_vector());
    test::check_bitwise(device_from_cpu.params[i].second.to_vector(),
                        cpu.params[i].second.to_vector());
  }
}

TEST_CASE("sampling-time decoding on the device equals the CPU's, token by token", "[device]") {
  emulate_cuda();
  const modtrain::RunConfig cfg = test::tiny_recipe("tiny_mod", 1, "");
  model::Transformer cpu(cfg.model(), 5), device(cfg.model(), 5);
  device.to(Device::CUDA);
  auto cpu_caches = cpu.make_caches(16), device_caches = device.make_caches(16);
  CHECK(device_caches[0].k.device() == Device::CUDA);
  for (int64_t pos = 0; pos < 16; ++pos) {
    const int64_t token = (pos * 37 + 11) % cfg.model().vocab_size();
    const Tensor a = cpu.decode_step(token, pos, cpu_caches);
    const Tensor b = device.decode_step(token, pos, device_caches);
    INFO("position " << pos);
    CHECK(b.device() == Device::CUDA);
    CHECK(b.to_vector() == a.to_vector());
  }
}

TEST_CASE("generation on the device draws the CPU's tokens (logits read once per token)",
          "[device]") {
  emulate_cuda();
  const modtrain::RunConfig cfg = test::tiny_recipe("tiny_mod", 1, "");
  model::Transformer cpu(cfg.model(), 5), device(cfg.model(), 5);
  device.to(Device::CUDA);
  for (double temperature : {0.0, 0.8}) {
    model::SamplingParams p;
    p.temperature = temperature;
    p.top_k = 40;
    p.seed = 9;
    INFO("temperature " << temperature);
    const auto a = model::generate(cpu, {3, 14, 15, 92}, 24, p);
    const auto b = model::generate(device, {3, 14, 15, 92}, 24, p);
    CHECK(b.tokens == a.tokens);
    CHECK(b.admitted == a.admitted);
  }
}

// train.cuda_graph: step 1 runs eagerly, step 2 is captured (its kernels recorded, not run)
// and every step from 2 on is a replay of that recording with the step's batch and learning
// rate loaded into the captured tensors. Warm-up changes the learning rate every step,
// max_norm 0.05 clips every step, two micro-batches accumulate, and validation runs eagerly
// between replays: a constant baked into the recording, or a host read inside it, would change
// the losses or throw.
using GraphCases = std::vector<std::pair<const char*, std::vector<std::string>>>;
static void require_graph_replays(const GraphCases& cases) {
  test::EmulatedCudaBackend& emulated = emulate_cuda();
  const std::vector<std::string> knobs = {"optimizer.warmup_steps=6", "optimizer.grad_clip=0.05",
                                          "train.grad_accum=2", "train.eval_every=3"};
  for (const auto& [recipe, sets] : cases) {
    INFO(recipe << " " << (sets.empty() ? "" : sets.front()));
    std::vector<std::string> extra = knobs;
    extra.insert(extra.end(), sets.begin(), sets.end());
    std::vector<std::string> graphed = extra;
    graphed.push_back("train.cuda_graph=true");
    const int before = emulated.captures();
    const Run graph = train_run(recipe, true, "", graphed);
    CHECK(emulated.captures() == before + 1);
    require_same(graph, train_run(recipe, false, "", extra));
  }
}

TEST_CASE("a CUDA-graph step replays exactly as eager CPU steps: dense and MoD (emulated device)",
          "[device][graph]") {
  require_graph_replays({{"tiny_dense", {}},
                         {"tiny_mod", {}},  // the predictor's BCE on detached inputs
                         {"tiny_mod", {"model.mod.causal.method=AUX_BCE"}},
                         {"tiny_mod", {"parallel.zero1=true"}}});  // the sharded optimizer's code
}

TEST_CASE("a CUDA-graph step replays exactly as eager CPU steps: MoE and MoDE (emulated device)",
          "[device][graph_moe]") {
  require_graph_replays({{"tiny_mode_integrated", {}},  // expert choice with a no-op expert
                         {"tiny_mode_staged", {}},
                         {"tiny_moe", {"model.moe.routing=TOKEN_CHOICE", "model.moe.top_k=2",
                                       "model.moe.balance_weight=0.01"}}});  // drops, balance loss
}

// train.fusions.classifier (on by default) against the unfused head (matmul, cross_entropy)
// over whole runs of 8 steps. One chunk holds the tiny batch and the fused op does the unfused
// kernels' arithmetic in the same order, so with one micro-batch the runs are bitwise equal.
// With two, the unfused head's dW adds into the gradient inside its GEMM (beta 1, BLAS summing
// in its own blocks), the fused one after its GEMM: the bound is every step's loss within 1e-6
// relative and every parameter within 1e-5 (max |a - b| over max |b| per tensor; measured
// 1.7e-6), replayed from a captured step on the emulated device.
namespace {
// The largest difference between two runs: of a step's loss (relative) and of a parameter
// (max |a - b| over max |b|, per tensor).
std::pair<double, double> run_difference(const Run& got, const Run& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  REQUIRE(got.params.size() == want.params.size());
  double loss = 0, param = 0;
  for (size_t s = 0; s < got.losses.size(); ++s)
    loss = std::max(loss, std::abs(got.losses[s] - want.losses[s]) / std::abs(want.losses[s]));
  for (size_t i = 0; i < got.params.size(); ++i) {
    const std::vector<double> a = got.params[i].second.to_vector(),
                              b = want.params[i].second.to_vector();
    REQUIRE(a.size() == b.size());
    double diff = 0, scale = 1e-30;
    for (size_t j = 0; j < a.size(); ++j) {
      diff = std::max(diff, std::abs(a[j] - b[j]));
      scale = std::max(scale, std::abs(b[j]));
    }
    param = std::max(param, diff / scale);
  }
  return {loss, param};
}
}  // namespace

TEST_CASE("train.fusions.classifier trains as the unfused head: CPU, emulated device, graphed",
          "[device][fusions]") {
  test::EmulatedCudaBackend& emulated = emulate_cuda();
  const std::string off = "train.fusions.classifier=false";
  {
    INFO("tiny_mod, one micro-batch, on the CPU: bitwise");
    const auto [loss, param] =
        run_difference(train_run("tiny_mod", false), train_run("tiny_mod", false, "", {off}));
    CHECK(loss == 0.0);
    CHECK(param == 0.0);
  }
  for (const char* recipe : {"tiny_dense", "tiny_mod"}) {
    const std::string accum = "train.grad_accum=2";
    const Run unfused = train_run(recipe, false, "", {accum, off});
    // The device replays what the CPU runs, bitwise (the cases above): one graphed run covers both.
    INFO(recipe << ", two micro-batches, graphed on the device");
    const int captures = emulated.captures();
    const auto [loss, param] =
        run_difference(train_run(recipe, true, "", {accum, "train.cuda_graph=true"}), unfused);
    std::printf("fusions.classifier, %s graphed: losses within %.3g, parameters within %.3g\n",
                recipe, loss, param);
    CHECK(emulated.captures() == captures + 1);
    CHECK(loss <= 1e-6);
    CHECK(param <= 1e-5);
  }
}

// train.fusions.optimizer_weight_copies (default true) updates every parameter in one
// multi-tensor pass; false takes the per-parameter path. A graphed device run with the fusion
// must equal an eager CPU run without it, bitwise, through AdamW and ZeRO-1 (weight copies need
// bf16: tests/parallel/optimizer_test.cpp trains them with f64 standing in).
TEST_CASE("the multi-tensor optimizer update trains as the per-parameter one (emulated device)",
          "[device]") {
  test::EmulatedCudaBackend& emulated = emulate_cuda();
  for (const char* zero1 : {"parallel.zero1=false", "parallel.zero1=true"}) {
    INFO(zero1);
    const std::vector<std::string> knobs = {"optimizer.grad_clip=0.05", "train.grad_accum=2",
                                            zero1};
    std::vector<std::string> fused = knobs, unfused = knobs;
    fused.push_back("train.cuda_graph=true");
    unfused.push_back("train.fusions.optimizer_weight_copies=false");
    const int before = emulated.captures();
    const Run graph = train_run("tiny_mod", true, "", fused);
    CHECK(emulated.captures() == before + 1);
    require_same(graph, train_run("tiny_mod", false, "", unfused));
  }
}

// train.fusions.add_norm, gelu_mlp and routed_scatter on the device path: steps captured and
// replayed with the fused add + norm, the fused GELU MLP and the routed blocks' fused gate,
// scatter and residual add give the CPU's eager steps with the separate ops, bitwise. tiny_dense
// has every add + norm site (in blocks, between blocks, before the final norm), tiny_mod the
// routed blocks' delta and (not recomputed) their scatter; LayerNorm and both recompute modes,
// whose regions output the fused norm and replay (SELECTIVE) the MLP's kept products.
TEST_CASE("a CUDA-graph step with the fused add + norm, GELU MLP and routed scatter replays "
          "exactly as unfused CPU steps",
          "[device][fusion]") {
  test::EmulatedCudaBackend& emulated = emulate_cuda();
  const std::vector<std::string> knobs = {"optimizer.warmup_steps=6", "train.grad_accum=2"};
  const GraphCases cases = {{"tiny_dense", {}},
                            {"tiny_dense", {"model.norm=LAYER", "train.recompute=SELECTIVE"}},
                            {"tiny_mod", {"model.norm=LAYER", "train.recompute=FULL"}},
                            {"tiny_mod", {}}};
  for (const auto& [recipe, sets] : cases) {
    INFO(recipe << " " << (sets.empty() ? "" : sets.front() + " " + sets.back()));
    std::vector<std::string> unfused = knobs, graphed = knobs;
    unfused.insert(unfused.end(), sets.begin(), sets.end());
    graphed.insert(graphed.end(), sets.begin(), sets.end());
    unfused.push_back("train.fusions.add_norm=false");
    unfused.push_back("train.fusions.gelu_mlp=false");
    unfused.push_back("train.fusions.routed_scatter=false");
    graphed.push_back("train.cuda_graph=true");
    const int before = emulated.captures();
    const Run graph = train_run(recipe, true, "", graphed);
    CHECK(emulated.captures() == before + 1);
    require_same(graph, train_run(recipe, false, "", unfused));
  }
}

// train.cuda_graph left unset: one process on CUDA captures its step after the warm-up
// (configs/config.h cuda_graph_on) and trains as the CPU does.
TEST_CASE("one process on CUDA captures its step by default", "[device][graph]") {
  test::EmulatedCudaBackend& emulated = emulate_cuda();
  const auto cfg = test::tiny_recipe("tiny_mod", kSteps, "", {"train.device=CUDA"});
  REQUIRE_FALSE(cfg.train().has_cuda_graph());
  const int before = emulated.captures();
  auto local = parallel::make_local_communicator();
  train::Trainer trainer(cfg, test::temp_dir("device_default_graph"), /*quiet=*/true, *local);
  trainer.run();
  CHECK(emulated.captures() == before + 1);
  Run graphed;
  graphed.losses = trainer.losses();
  graphed.params = trainer.full_parameters();
  require_same(graphed, train_run("tiny_mod", false));
}

// The clip factor reaches the update through the optimizer (no pass of its own over the
// gradients): a run that clips every step must leave the trajectory of one that never clips.
// Adam's first step is scale-free, so the losses part from the third step on. Eager and ZeRO-1.
TEST_CASE("optimizer.grad_clip changes the update, through AdamW and ZeRO-1", "[device]") {
  for (const char* zero1 : {"parallel.zero1=false", "parallel.zero1=true"}) {
    INFO(zero1);
    const Run clipped = train_run("tiny_mod", false, "", {"optimizer.grad_clip=0.05", zero1});
    const Run unclipped = train_run("tiny_mod", false, "", {"optimizer.grad_clip=0", zero1});
    REQUIRE(clipped.losses.size() == kSteps);
    CHECK(clipped.losses[0] == unclipped.losses[0]);
    for (size_t s = 2; s < kSteps; ++s) {
      INFO("step " << s + 1);
      CHECK(clipped.losses[s] != unclipped.losses[s]);
    }
  }
}

TEST_CASE("train.cuda_graph resumes: the first step after a checkpoint runs eagerly, then "
          "replays", "[device]") {
  const std::vector<std::string> graphed = {"train.cuda_graph=true", "optimizer.warmup_steps=6"};
  const Run cpu = train_run("tiny_mod", false, "", {"optimizer.warmup_steps=6"});
  const Run graph = train_run("tiny_mod", true, "", graphed);
  const Run resumed = train_run("tiny_mod", true, checkpoint_at(graph, 4), graphed);
  require_same(resumed, cpu, 4);
}

// Several processes are captured too (their collectives join the graph: device_parallel_tests).
TEST_CASE("train.cuda_graph refuses what it cannot capture, naming the field", "[device]") {
  CHECK_THROWS_WITH(test::tiny_recipe("tiny_dense", 1, "", {"train.cuda_graph=true"}),
                    Catch::Contains("train.cuda_graph") && Catch::Contains("train.device"));
  CHECK_NOTHROW(test::tiny_recipe("tiny_mod", 1, "dp=2",
                                  {"train.cuda_graph=true", "train.device=CUDA"}));
}

TEST_CASE("a host read inside a capture fails it, naming the copy", "[device]") {
  test::EmulatedCudaBackend& emulated = emulate_cuda();
  const Tensor t = Tensor::full({3}, 2.0, DType::F32, Device::CUDA);
  emulated.begin_capture();
  CHECK_THROWS_WITH(t.to(Device::CPU), Catch::Contains("inside a captured step"));
  const auto work = emulated.end_capture();
  // Recorded, not run: a captured fill leaves the tensor alone until replayed.
  Tensor u = t.clone();
  emulated.begin_capture();
  backend(Device::CUDA).fill(u, 5.0);
  const auto fill = emulated.end_capture();
  CHECK(u.to(Device::CPU).to_vector() == std::vector<double>{2, 2, 2});
  fill->replay();
  CHECK(u.to(Device::CPU).to_vector() == std::vector<double>{5, 5, 5});
}

TEST_CASE("a device tensor's values are not readable from the host", "[device]") {
  emulate_cuda();
  const Tensor t = Tensor::full({3}, 2.0, DType::F32, Device::CUDA);
  CHECK_THROWS_WITH(t.at(0), Catch::Contains("on cuda"));
  CHECK(t.narrow0(1, 1).item() == 2.0);  // item() and to() copy to the host
  CHECK(t.to(Device::CPU).to_vector() == std::vector<double>{2, 2, 2});
}

TEST_CASE("train.precision BF16 without train.device CUDA is a config error naming the field",
          "[device]") {
  CHECK_THROWS_WITH(test::tiny_recipe("tiny_dense", 1, "", {"train.precision=BF16"}),
                    Catch::Contains("train.precision") && Catch::Contains("CUDA"));
}

// train.recompute inside a captured step: the recomputation's kernels are recorded in backward
// like any other, SELECTIVE's kept outputs are written by the replayed forward and read by the
// replayed backward, and nothing reads the device on the host. Against eager CPU steps without
// recomputation, bitwise.
TEST_CASE("a CUDA-graph step with recomputation replays exactly as eager CPU steps without it",
          "[device][recompute]") {
  test::EmulatedCudaBackend& emulated = emulate_cuda();
  const std::vector<std::string> knobs = {"optimizer.warmup_steps=6", "train.grad_accum=2"};
  for (const char* recipe : {"tiny_mode_staged"}) {  // MoD routing around an MoE MLP
    const Run cpu = train_run(recipe, false, "", knobs);
    for (const char* mode : {"FULL", "SELECTIVE"}) {
      INFO(recipe << " with train.recompute=" << mode);
      std::vector<std::string> graphed = knobs;
      graphed.push_back("train.cuda_graph=true");
      graphed.push_back(std::string("train.recompute=") + mode);
      const int before = emulated.captures();
      const Run graph = train_run(recipe, true, "", graphed);
      CHECK(emulated.captures() == before + 1);
      require_same(graph, cpu);
    }
  }
}

}  // namespace mod
