// Checkpoints across ranks (mpiexec -n 2 and -n 4; a world of one without mpiexec): every rank
// writes its own slice (rows, columns, a flat ZeRO-1-style shard) and rank 0 alone writes a
// replicated tensor; every rank then reads every tensor back whole and in halves, thirds and
// quarters, bitwise. A bad entry or a write error (a file size limit) on the last rank makes the
// save throw the same error on every rank, and the previous checkpoint stays current.
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <catch2/catch.hpp>

#include "parallel/world.h"
#include "tests/train/checkpoint/helpers.h"
#include "train/checkpoint/reader.h"
#include "train/checkpoint/writer.h"

using namespace mod;
using namespace mod::test;

namespace {

// A directory every rank sees: rank 0 makes it and broadcasts its path.
std::string shared_scratch(parallel::Communicator& comm) {
  Tensor buf = Tensor::zeros({64}, DType::I64);
  if (comm.rank() == 0) {
    char tmpl[] = "/tmp/modtrain_ckpt_mpi_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    std::memcpy(buf.raw_data(), tmpl, sizeof tmpl);
  }
  comm.broadcast(buf, 0);
  return std::string(buf.data<char>());
}

const Tensor kRow = counting({12, 6}), kCol = counting({6, 12}, DType::F64, 50);
const Tensor kFlat = counting({24}, DType::F32, -7), kRep = counting({5}, DType::I64, 3);

// This rank's entries: rows, columns and the flat tensor split n ways; kRep written by rank 0.
std::vector<ckpt::TensorEntry> my_entries(int rank, int n) {
  auto rep = whole("model/rep", kRep);
  rep.writer = rank == 0;
  return {piece("model/row", kRow, 0, rank, n), piece("model/col", kCol, 1, rank, n),
          piece("optim/m/flat", kFlat, 0, rank, n), rep};
}

ckpt::TrainState mesh_state(int64_t step, int n) {
  ckpt::TrainState s = state_at(step);
  s.mesh = {1, n, 0, n};
  return s;
}

void check_every_sharding(const ckpt::CheckpointReader& r) {
  const std::vector<std::pair<std::string, Tensor>> all = {
      {"model/row", kRow}, {"model/col", kCol}, {"optim/m/flat", kFlat}, {"model/rep", kRep}};
  for (const auto& [name, full] : all) {
    INFO(name);
    CHECK(bitwise_equal(r.read(name, full.shape(), -1, 0, full.dtype()), full));
    for (int dim = 0; dim < full.dim(); ++dim)
      for (int ways : {2, 3, 4}) {
        if (full.size(dim) % ways != 0) continue;
        const int64_t len = full.size(dim) / ways;
        for (int k = 0; k < ways; ++k) {
          Shape shape = full.shape();
          shape[dim] = len;
          CHECK(bitwise_equal(r.read(name, shape, dim, k * len, full.dtype()),
                              slice(full, dim, k * len, len)));
        }
      }
  }
}

}  // namespace

TEST_CASE("each rank saves its slice and any sharding reads it back", "[mpi][checkpoint]") {
  parallel::Communicator& comm = parallel::world();
  const int rank = comm.rank(), n = comm.size();
  const std::string run = shared_scratch(comm);
  ckpt::Checkpointer writer(run, comm);
  writer.save(my_entries(rank, n), mesh_state(4, n));
  const std::string dir = run + "/checkpoints/step_00000004";
  CHECK(writer.last_committed() == dir);
  for (int r = 0; r < n; ++r) CHECK(fs::exists(dir + "/shard_" + std::to_string(r) + ".bin"));
  {
    ckpt::CheckpointReader reader(*ckpt::find_latest(run));
    CHECK(reader.state().mesh.world_size == n);
    CHECK(reader.state().rng_state == std::vector<uint64_t>{1, 2, 3, 4});
    check_every_sharding(reader);
  }

  // Background: every rank's thread writes; wait() commits on every rank.
  writer.save(my_entries(rank, n), mesh_state(5, n), {.background = true, .keep_last = 1});
  writer.wait();
  CHECK(file_text(run + "/checkpoints/latest") == "step_00000005\n");
  check_every_sharding(ckpt::CheckpointReader(run + "/checkpoints/step_00000005"));
  comm.barrier();
  CHECK_FALSE(fs::exists(dir));  // keep_last 1

  // A bad entry on the last rank: every rank throws its error.
  std::vector<ckpt::TensorEntry> bad = my_entries(rank, n);
  if (rank == n - 1) bad[0].shard_offset = 100;
  const std::string who = n > 1 ? "rank " + std::to_string(n - 1) + ": " : "";
  CHECK_THROWS_WITH(writer.save(bad, mesh_state(6, n)),
                    Catch::Contains(who + "checkpoint: entry 'model/row'"));

  // A write error on the last rank only (EFBIG under a file size limit).
  rlimit saved{};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  if (rank == n - 1) {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit small{64, saved.rlim_max};
    ::setrlimit(RLIMIT_FSIZE, &small);
  }
  std::string error = "no error";
  try {
    writer.save(my_entries(rank, n), mesh_state(6, n));
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  if (rank == n - 1) ::setrlimit(RLIMIT_FSIZE, &saved);
  CHECK_THAT(error, Catch::Contains(who + "checkpoint: cannot write " + run +
                                    "/checkpoints/step_00000006.tmp/shard_" +
                                    std::to_string(n - 1) + ".bin: File too large"));
  comm.barrier();
  CHECK_FALSE(fs::exists(run + "/checkpoints/step_00000006.tmp"));
  CHECK(file_text(run + "/checkpoints/latest") == "step_00000005\n");
  check_every_sharding(ckpt::CheckpointReader(*ckpt::find_latest(run)));

  comm.barrier();
  if (rank == 0) fs::remove_all(run);
}
