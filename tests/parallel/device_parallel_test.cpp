// Several processes training with train.device CUDA, without a GPU: the emulated device
// (emulated_cuda.h) for the kernels, and device tensors crossing ranks through MPI via host
// copies (host_staging_communicator.h) where a GPU job would use NCCL. Every layout must train
// exactly as the same layout on the CPU, bitwise: the vocabulary-parallel embedding and loss,
// the tensor-parallel mappings, gradient buckets, ZeRO-1 and the expert exchanges all keep
// device tensors on the device, or a host access to one throws. Under train.cuda_graph the
// collectives are captured with the step's kernels and run again at every replay (as NCCL's
// are in a CUDA graph), so a collective that only happened at capture, or a host value baked
// into one, shows as a different loss; pipeline stages (pp 2, 1F1B) among the layouts. With
// every fusion on (the default) each other layout also trains as with the separate ops.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "parallel/device_communicator.h"
#include "tests/support/bitwise.h"
#include "tests/support/emulated_cuda.h"
#include "tests/support/host_staging_communicator.h"
#include "tests/support/tiny_runs.h"
#include "train/trainer.h"

namespace mod {
namespace {

constexpr int kSteps = 6;

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;
};

Run train_run(const std::string& recipe, const std::string& layout, bool on_device,
              bool graphed = false, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = {std::string("train.device=") + (on_device ? "CUDA" : "CPU")};
  if (on_device) sets.push_back(std::string("train.cuda_graph=") + (graphed ? "true" : "false"));
  sets.insert(sets.end(), extra.begin(), extra.end());
  const auto cfg = test::tiny_recipe(recipe, kSteps, layout, sets);
  train::Trainer trainer(cfg, test::temp_dir("device_parallel"), /*quiet=*/true,
                         parallel::world());
  trainer.run();
  return {trainer.losses(), trainer.full_parameters()};
}

void require_same(const Run& got, const Run& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(got.losses[s] == want.losses[s]);
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    INFO(want.params[i].first);
    test::check_bitwise(got.params[i].second.to(Device::CPU).to_vector(),
                        want.params[i].second.to_vector());
  }
}

void install_emulated_gpus() {
  test::emulate_cuda();
  parallel::set_device_communicator_factory_for_testing([](parallel::Communicator& world) {
    return std::make_unique<test::HostStagingCommunicator>(world.split(0, world.rank(), "world"));
  });
}

}  // namespace

TEST_CASE("every parallel layout trains on the (emulated) device exactly as on the CPU",
          "[device][mpi]") {
  if (parallel::world().size() != 2) {
    WARN("the layouts need 2 processes: mpi:device_parallel_tests:np2 runs them");
    return;
  }
  install_emulated_gpus();
  struct Case {
    const char* recipe;
    const char* layout;
    std::vector<std::string> sets = {};
  };
  // Pipeline stages (pp 2, interleaved 1F1B with 2 chunks a rank, 2 micro-batches; 1F1B runs
  // over NCCL in nccl_layouts_test.cpp): their transfers in rounds (Communicator::send_recv),
  // two links each way between the ranks, the losses and statistics read only after the step.
  for (const Case& c : {Case{"tiny_mod", "dp=1 tp=2"}, Case{"tiny_dense", "dp=2 tp=1 zero1=true"},
                        Case{"tiny_mode_staged", "dp=2 ep=2"}, Case{"tiny_mod", "dp=2 tp=1"},
                        Case{"tiny_mod", "dp=1 pp=2",
                             {"train.grad_accum=2", "parallel.pp_schedule=INTERLEAVED_1F1B",
                              "parallel.virtual_stages=2"}}}) {
    // Point-to-point messages between CPU processes need MPI: the rendezvous launcher's
    // communicator carries control traffic only, so its twin entry leaves pp out.
    if (std::string(c.layout).find("pp=") != std::string::npos && !std::getenv("OMPI_COMM_WORLD_RANK"))
      continue;
    const Run cpu = train_run(c.recipe, c.layout, false, false, c.sets);
    for (const bool graphed : {false, true}) {
      INFO(c.recipe << ", layout " << c.layout << (graphed ? ", train.cuda_graph" : ", eager"));
      const int captures = test::emulate_cuda().captures();
      const Run device = train_run(c.recipe, c.layout, true, graphed, c.sets);
      CHECK(test::emulate_cuda().captures() == captures + (graphed ? 1 : 0));
      require_same(device, cpu);
    }
  }
  // ZeRO-3 eagerly: its gathers, releases (Storage::resize) and sharded AdamW on device tensors.
  // Not graphed here: this device records tensors, not addresses, so a capture cannot hold a
  // parameter's storage gathered and released inside it (nccl_layouts_tests_emulated does).
  const Run cpu = train_run("tiny_mod", "dp=2 tp=1 zero_stage=3", false);
  INFO("tiny_mod, layout dp=2 tp=1 zero_stage=3, eager");
  require_same(train_run("tiny_mod", "dp=2 tp=1 zero_stage=3", true, false), cpu);
}

// The fused step (every train.fusions switch on, the default) against the separate ops (every
// one off) in the parallel layouts: tensor-parallel MoD (whose hooks sit around the fused MLP
// and router ops) under SELECTIVE recomputation, ZeRO-1 MoD under FULL, expert-parallel staged
// MoDE, and data-parallel MoD. The fused side runs captured on the emulated device, the unfused
// side eagerly on the CPU: bitwise, since each fused op's reference runs the ops it replaces in
// their order (one micro-batch, so the chunked classifier's dW adds as the unfused head's does).
TEST_CASE("every parallel layout trains with the fusions as with the separate ops", "[device][mpi]") {
  if (parallel::world().size() != 2) {
    WARN("the layouts need 2 processes: mpi:device_parallel_tests:np2 runs them");
    return;
  }
  install_emulated_gpus();
  std::vector<std::string> unfused;
  for (const char* f : {"optimizer_weight_copies", "classifier", "add_norm", "gelu_mlp",
                        "router_scores", "routed_scatter"})
    unfused.push_back(std::string("train.fusions.") + f + "=false");
  struct Case {
    const char* recipe;
    const char* layout;
    const char* recompute;
  };
  for (const Case c : {Case{"tiny_mod", "dp=1 tp=2", "SELECTIVE"},
                       Case{"tiny_mod", "dp=2 tp=1 zero1=true", "FULL"},
                       Case{"tiny_mode_staged", "dp=2 ep=2", "NONE"},
                       Case{"tiny_mod", "dp=2 tp=1", "NONE"}}) {
    INFO(c.recipe << ", layout " << c.layout << ", train.recompute " << c.recompute);
    const std::string recompute = std::string("train.recompute=") + c.recompute;
    std::vector<std::string> separate = unfused;
    separate.push_back(recompute);
    const Run want = train_run(c.recipe, c.layout, false, false, separate);
    const int captures = test::emulate_cuda().captures();
    const Run fused = train_run(c.recipe, c.layout, true, true, {recompute});
    CHECK(test::emulate_cuda().captures() == captures + 1);
    require_same(fused, want);
  }
}

TEST_CASE("without NCCL or a test stand-in, several processes on CUDA is an error naming NCCL",
          "[device][mpi]") {
#ifdef MOD_HAVE_NCCL
  SUCCEED("this build has NCCL: make_device_communicator builds it");
#else
  parallel::set_device_communicator_factory_for_testing({});
  CHECK_THROWS_WITH(parallel::make_device_communicator(parallel::world()), Catch::Contains("NCCL"));
#endif
}

}  // namespace mod
