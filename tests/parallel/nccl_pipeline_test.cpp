// Pipeline stages on the GPU path combined with the other layouts and under interleaving, their
// activations and gradients crossing ranks as grouped ncclSend/ncclRecv (Communicator::send_recv,
// one group a round): pp 2 x tp 2 with sequence parallelism (each tp rank sends its [b, T/2, D]
// part), staged MoDE at pp 2 x dp 2 x ep 2 (the all-to-all inside each stage) and pp 4 under
// interleaved 1F1B (2 chunks a rank: the last rank feeds the first's second chunk) at 4 ranks;
// pp 2 under interleaved 1F1B (two links each way between the ranks) and under GPipe (every
// forward, then every backward) at 2. Part of
// nccl_layouts_tests_emulated (the real CUDA code on the SIMT emulator, NCCL's stand-in between
// processes); nccl_layouts_test.cpp has pp 2 alone and pp 2 x dp 2 with ZeRO-3.
//
// Each eager run is compared with one process on the CPU (trained on world rank 0 alone), so
// the layout's sums (the gradient norm's over tp, ep and pp) are checked, not only the device:
// every step's loss and gradient norm (metrics.csv) within 1e-3 relative, as gpu_training_tests
// compares one GPU with the CPU; the graphed run with the eager one within 1e-5 (the same
// kernels, the transfers captured in the graph). 3 steps of 2 micro-batches (4 under pp 4
// interleaved) of one sequence a rank at the emulator's scale (nccl_layouts_runs.h); at 4 ranks
// MoDE and pp 4 at d_model 64 (pp 4 on sequences of 32), to keep the np4 entry's time.
//
// And NcclCommunicator::send_recv's refusal of a batch that mixes CPU and CUDA tensors, after
// which the communicator still exchanges.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/nccl_communicator.h"
#include "parallel/world.h"
#include "tests/parallel/nccl_layouts_runs.h"
#include "tests/support/shared_dir.h"

namespace mod {

using namespace nccl_runs;

namespace {

constexpr int kPipelineSteps = 3;

struct PipelineLayout {
  const char* recipe;
  const char* layout;  // test::tiny_recipe's
  int ranks;
  std::vector<std::string> sets;      // the layout's and one process's: model, batch, micro-batches
  std::vector<std::string> schedule;  // the layout's only
};

// One process's CPU run, trained on world rank 0 alone; its losses sent to every rank, its
// gradient norms on rank 0 (the one that compares them).
Run one_process(const PipelineLayout& l) {
  parallel::Communicator& world = parallel::world();
  parallel::Communicator& alone = test::self_group();  // a collective split the first time
  Run one;
  Tensor losses = Tensor::zeros({kPipelineSteps}, DType::F64);
  if (world.rank() == 0) {
    one = train_run(l.recipe, "", "CPU", false, l.sets, alone, "", kPipelineSteps);
    REQUIRE(one.losses.size() == static_cast<size_t>(kPipelineSteps));
    losses = Tensor::from_vector(one.losses, {kPipelineSteps}, DType::F64);
  }
  world.broadcast(losses, 0);
  one.losses = losses.to_vector();
  return one;
}

// Losses on every rank, gradient norms on world rank 0, each step within rtol relative.
void check_close(const Run& got, const Run& want, double rtol) {
  require_close(got, want, rtol);
  if (parallel::world().rank() != 0) return;
  REQUIRE(got.grad_norms.size() == want.grad_norms.size());
  REQUIRE(want.grad_norms.size() == static_cast<size_t>(kPipelineSteps));
  for (size_t s = 0; s < want.grad_norms.size(); ++s) {
    const double g = got.grad_norms[s], w = want.grad_norms[s];
    INFO("step " << s + 1 << ": gradient norm " << g << " vs " << w);
    CHECK(std::isfinite(g));
    CHECK(std::abs(g - w) <= rtol * std::abs(w));
  }
}

}  // namespace

TEST_CASE("pp with tp, ep, interleaving and GPipe trains on the GPU over NCCL as one process, "
          "eager and graphed",
          "[mpi][cuda]") {
  const int n = parallel::world().size();
  // Checkpoints off: 3 steps, nothing resumes.
  const std::vector<std::string> micro2 = {"train.grad_accum=2", "checkpoint.every_steps=0"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<std::string> interleaved = {"parallel.pp_schedule=INTERLEAVED_1F1B",
                                                "parallel.virtual_stages=2"};
  const std::vector<PipelineLayout> layouts = {
      // dp 1: a global batch of 2, one sequence a micro-batch.
      {"tiny_mod", "dp=1 tp=2 pp=2 sequence_parallel=true", 4,
       with(micro2, {"train.batch_size=2"}), {}},
      // Each stage's dp pair is its ep pair: 4 sequences, one a rank and micro-batch.
      {"tiny_mode_staged", "dp=2 pp=2 ep=2", 4,
       with(micro2, {"train.batch_size=4", "model.d_model=64", "model.d_ff=256"}), {}},
      // pp x v = 8 virtual stages of one block; interleaving needs m a multiple of pp.
      {"tiny_mod", "dp=1 pp=4", 4,
       {"train.grad_accum=4", "checkpoint.every_steps=0", "train.batch_size=4",
        "model.n_layers=8", "model.d_model=64", "model.d_ff=256", "model.seq_len=32"},
       interleaved},
      {"tiny_mod", "dp=1 pp=2", 2, with(micro2, {"train.batch_size=2"}), interleaved},
      // GPipe: the last stage runs both forwards before its backwards (1F1B alternates them
      // there), so both micro-batches' activations are in flight on each rank.
      {"tiny_mod", "dp=1 pp=2", 2, with(micro2, {"train.batch_size=2"}),
       {"parallel.pp_schedule=GPIPE"}}};
  int ran = 0;
  for (const PipelineLayout& l : layouts) {
    if (l.ranks != n) continue;
    ++ran;
    INFO(l.recipe << ", layout " << l.layout << ", "
                  << (l.schedule.empty() ? "parallel.pp_schedule=ONE_F_ONE_B" : l.schedule[0]));
    const Run one = one_process(l);
    const std::vector<std::string> sets = with(l.sets, l.schedule);
    const Run eager = train_run(l.recipe, l.layout, "CUDA", false, sets, parallel::world(), "",
                                kPipelineSteps);
    check_close(eager, one, 1e-3);
    const Run graphed = train_run(l.recipe, l.layout, "CUDA", true, sets, parallel::world(), "",
                                  kPipelineSteps);
    check_close(graphed, eager, 1e-5);
  }
  if (ran == 0) WARN("no pipeline layout for " << n << " ranks: np2 and np4 run them");
}

// CPU tensors go to the host communicator and CUDA tensors to NCCL, so one batch cannot hold
// both. The refusal comes before any NCCL call (every rank refuses alike, no group is left
// open): a correct batch then exchanges around the ring.
TEST_CASE("NCCL send_recv refuses a batch of CPU and CUDA tensors, naming the call",
          "[mpi][cuda]") {
  parallel::Communicator& world = parallel::world();
  if (world.size() < 2) {
    WARN("needs 2 ranks or more");
    return;
  }
  auto comm = parallel::make_nccl_communicator(world.split(0, world.rank(), "nccl_mixed"));
  const int rank = comm->rank(), size = comm->size();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const Tensor mine = Tensor::full({5}, rank + 1.0, DType::F32, Device::CUDA);
  const Tensor on_cpu = Tensor::zeros({5}, DType::F32);
  const Tensor on_gpu = Tensor::zeros({5}, DType::F32, Device::CUDA);
  using parallel::PeerTransfer;
  const std::string where = "send_recv on 'nccl_mixed' (rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + "): CPU and CUDA tensors in one batch";
  // Either first: the CPU one or the CUDA one.
  CHECK_THROWS_WITH(comm->send_recv({{PeerTransfer::Send, mine, next, 0},
                                     {PeerTransfer::Recv, on_cpu, prev, 0}}),
                    Catch::Matchers::Contains(where));
  CHECK_THROWS_WITH(comm->send_recv({{PeerTransfer::Send, mine.to(Device::CPU), next, 0},
                                     {PeerTransfer::Recv, on_gpu, prev, 0}}),
                    Catch::Matchers::Contains(where));
  comm->send_recv({{PeerTransfer::Send, mine, next, 0}, {PeerTransfer::Recv, on_gpu, prev, 0}})
      ->wait();
  CHECK(on_gpu.to(Device::CPU).to_vector() == std::vector<double>(5, prev + 1.0));
}

}  // namespace mod
