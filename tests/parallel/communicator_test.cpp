// Communicator tests, run as a world of one and under mpirun -n 2 and -n 4 (tests/CMakeLists.txt,
// mod_add_mpi_test). Every rank can make every rank's input from seed + rank, so each result is
// checked against a single-process computation done locally.
// Invariant: a check that fails never changes which collectives a rank calls next (CHECK, not
// REQUIRE, inside loops), so one failure cannot desynchronise the ranks into a hang.
// Hidden cases ([.timeout], [.rank_dies], [.truncate], [.local_abort]) end the job on purpose;
// each has its own CTest entry run through tests/parallel/expect_failure.sh.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/random.h"
#include "tests/support/env_guard.h"
#include "parallel/world.h"

using namespace mod;
using namespace mod::parallel;
using Catch::Matchers::Contains;

namespace {

constexpr uint64_t kSeed = 20240611;
const std::vector<int64_t> kSizes = {1, 7, 1000, 100003};

// Rank r's input for the case numbered `salt`: normal floats, integers in [-1000, 1000), or
// random bf16 bit patterns (finite ones).
Tensor rank_data(const Shape& shape, DType dtype, int rank, uint64_t salt) {
  Rng rng(kSeed + 7919 * salt + static_cast<uint64_t>(rank));
  switch (dtype) {
    case DType::F32:
    case DType::F64:
      return randn(shape, rng, dtype);
    case DType::I32:
    case DType::I64: {
      std::vector<int64_t> v(static_cast<size_t>(shape_numel(shape)));
      for (auto& x : v) x = rng.below(2000) - 1000;
      return Tensor::from_indices(v, shape, dtype);
    }
    case DType::BF16: {
      Tensor t = Tensor::empty(shape, DType::BF16);
      auto* bits = t.data<uint16_t>();
      for (int64_t i = 0; i < t.numel(); ++i)
        bits[i] = static_cast<uint16_t>(rng.below(0x7f00));  // below the exponent of inf/nan
      return t;
    }
  }
  return {};
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Elements of `got` farther from `want` than tol * scale[i] (exact when tol is 0).
int64_t mismatches(const Tensor& got, const std::vector<double>& want,
                   const std::vector<double>& scale, double tol) {
  const std::vector<double> g = got.to_vector();
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::abs(g[i] - want[i]) <= tol * scale[i])) ++bad;
  return bad;
}

// Relative tolerance of a reduction over `n` ranks in dtype (0: exact).
double reduce_tol(DType dtype, ReduceOp op, int n) {
  if (op != ReduceOp::Sum || !is_floating(dtype)) return 0;
  return n * (dtype == DType::F32 ? 1e-6 : 1e-14);
}

// The single-process result of reducing rank_data over `ranks`, and sum |x| per element.
struct Expected {
  std::vector<double> value, scale;
};
Expected reduce_locally(const Shape& shape, DType dtype, ReduceOp op, uint64_t salt,
                        const std::vector<int>& ranks) {
  Expected e;
  for (size_t k = 0; k < ranks.size(); ++k) {
    const std::vector<double> x = rank_data(shape, dtype, ranks[k], salt).to_vector();
    if (k == 0) {
      e.value = x;
      e.scale.assign(x.size(), 0.0);
    }
    for (size_t i = 0; i < x.size(); ++i) {
      if (k > 0) {
        double& v = e.value[i];
        v = op == ReduceOp::Sum   ? v + x[i]
            : op == ReduceOp::Max ? std::max(v, x[i])
                                  : std::min(v, x[i]);
      }
      e.scale[i] += std::abs(x[i]);
    }
  }
  return e;
}

std::vector<int> all_ranks(const Communicator& comm) {
  std::vector<int> r(static_cast<size_t>(comm.size()));
  for (int i = 0; i < comm.size(); ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

using test::EnvGuard;

}  // namespace

TEST_CASE("all_reduce matches the single-process reduction", "[mpi]") {
  Communicator& comm = world();
  uint64_t salt = 0;
  for (DType dtype : {DType::F32, DType::F64, DType::I32, DType::I64})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min})
      for (int64_t n : kSizes) {
        ++salt;
        CAPTURE(dtype_name(dtype), reduce_op_name(op), n);
        Tensor t = rank_data({n}, dtype, comm.rank(), salt);
        comm.all_reduce(t, op);
        const Expected e = reduce_locally({n}, dtype, op, salt, all_ranks(comm));
        CHECK(mismatches(t, e.value, e.scale, reduce_tol(dtype, op, comm.size())) == 0);
      }
}

TEST_CASE("all_reduce results are bitwise equal on every rank", "[mpi]") {
  Communicator& comm = world();
  uint64_t salt = 100;
  for (DType dtype : {DType::F32, DType::F64})
    for (int64_t n : kSizes) {
      ++salt;
      CAPTURE(dtype_name(dtype), n);
      Tensor t = rank_data({n, 1}, dtype, comm.rank(), salt);
      comm.all_reduce(t);
      Tensor all = Tensor::empty({comm.size() * n, 1}, dtype);
      comm.all_gather(t, all);
      for (int r = 0; r < comm.size(); ++r) CHECK(same_bytes(all.narrow0(r * n, n), t));
    }
}

TEST_CASE("all_reduce_async with several works outstanding", "[mpi]") {
  Communicator& comm = world();
  struct Case {
    Shape shape;
    DType dtype;
    ReduceOp op;
    uint64_t salt;
  };
  const std::vector<Case> cases = {{{100003}, DType::F32, ReduceOp::Sum, 201},
                                   {{7, 3}, DType::F64, ReduceOp::Max, 202},
                                   {{1000}, DType::I64, ReduceOp::Min, 203},
                                   {{1}, DType::F32, ReduceOp::Sum, 204},
                                   {{33, 31}, DType::I32, ReduceOp::Sum, 205}};
  std::vector<Tensor> tensors;
  std::vector<std::unique_ptr<Work>> works;
  for (const Case& c : cases) {
    tensors.push_back(rank_data(c.shape, c.dtype, comm.rank(), c.salt));
    works.push_back(comm.all_reduce_async(tensors.back(), c.op));
  }
  // Wait out of order; the last work is never waited and completes in its destructor.
  for (size_t i = works.size() - 1; i-- > 0;) works[i]->wait();
  works[1]->wait();  // a second wait is a no-op
  works.clear();
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    CAPTURE(i);
    const Expected e = reduce_locally(c.shape, c.dtype, c.op, c.salt, all_ranks(comm));
    CHECK(mismatches(tensors[i], e.value, e.scale, reduce_tol(c.dtype, c.op, comm.size())) == 0);
  }
}

TEST_CASE("reduce_scatter gives each rank its chunk of the reduction", "[mpi]") {
  Communicator& comm = world();
  const int64_t size = comm.size();
  uint64_t salt = 300;
  for (DType dtype : {DType::F32, DType::F64, DType::I64})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min})
      for (int64_t n : kSizes) {
        ++salt;
        CAPTURE(dtype_name(dtype), reduce_op_name(op), n);
        // in holds about n elements (each rank makes every rank's in, so n per chunk would cost
        // size^2 * n per rank); odd chunks, and one 2-D case whose chunks are rows.
        const int64_t cols = n == 7 ? 3 : 1;
        const int64_t rows = n == 7 ? 2 : std::max<int64_t>(1, n / size) | 1;
        const Shape in_shape = {size * rows, cols};
        Tensor in = rank_data(in_shape, dtype, comm.rank(), salt);
        Tensor out = Tensor::full({rows, cols}, -7, dtype);
        comm.reduce_scatter(in, out, op);
        const Expected e = reduce_locally(in_shape, dtype, op, salt, all_ranks(comm));
        const auto begin = static_cast<size_t>(comm.rank() * rows * cols);
        const auto end = begin + static_cast<size_t>(rows * cols);
        const std::vector<double> want(e.value.begin() + begin, e.value.begin() + end);
        const std::vector<double> scale(e.scale.begin() + begin, e.scale.begin() + end);
        CHECK(mismatches(out, want, scale, reduce_tol(dtype, op, comm.size())) == 0);
      }
}

TEST_CASE("reduce_scatter_async with several works outstanding equals reduce_scatter", "[mpi]") {
  Communicator& comm = world();
  const int64_t size = comm.size();
  std::vector<Tensor> ins, outs, want;
  std::vector<std::unique_ptr<Work>> works;
  uint64_t salt = 400;
  for (DType dtype : {DType::F32, DType::F64})
    for (int64_t rows : {1, 333, 4096}) {
      const Shape in_shape = {size * rows};
      ins.push_back(rank_data(in_shape, dtype, comm.rank(), ++salt));
      outs.push_back(Tensor::full({rows}, -7, dtype));
      want.push_back(Tensor::full({rows}, -7, dtype));
      comm.reduce_scatter(ins.back(), want.back());
      works.push_back(comm.reduce_scatter_async(ins.back(), outs.back()));
    }
  for (auto& w : works) w->test();  // progress without blocking; may or may not be done
  for (size_t i = works.size(); i-- > 0;) works[i]->wait();  // out of launch order
  for (size_t i = 0; i < outs.size(); ++i) {
    CAPTURE(i);
    CHECK(same_bytes(outs[i], want[i]));
  }
  CHECK_THROWS_WITH(comm.reduce_scatter_async(Tensor::zeros({size * 4}), Tensor::zeros({3})),
                    Contains("reduce_scatter_async on 'world'") && Contains("expected out [4]"));
  CHECK_THROWS_WITH(comm.reduce_scatter_async(Tensor::zeros({size * 4}, DType::BF16),
                                              Tensor::zeros({4}, DType::BF16)),
                    Contains("reduce_scatter_async on 'world'") && Contains("bf16"));
  comm.barrier();
}

TEST_CASE("all_gather_async with several works outstanding equals all_gather", "[mpi]") {
  Communicator& comm = world();
  const int64_t size = comm.size();
  std::vector<Tensor> ins, outs, want;
  std::vector<std::unique_ptr<Work>> works;
  uint64_t salt = 500;
  for (DType dtype : {DType::F32, DType::F64, DType::BF16})
    for (int64_t rows : {1, 333, 4096}) {
      ins.push_back(rank_data({rows}, dtype, comm.rank(), ++salt));
      outs.push_back(Tensor::full({size * rows}, -7, dtype));
      want.push_back(Tensor::full({size * rows}, -7, dtype));
      comm.all_gather(ins.back(), want.back());
      works.push_back(comm.all_gather_async(ins.back(), outs.back()));
    }
  for (auto& w : works) w->test();
  for (size_t i = works.size(); i-- > 0;) works[i]->wait();  // out of launch order
  for (size_t i = 0; i < outs.size(); ++i) {
    CAPTURE(i);
    CHECK(same_bytes(outs[i], want[i]));
  }
  CHECK_THROWS_WITH(comm.all_gather_async(Tensor::zeros({4}), Tensor::zeros({size * 4 + 1})),
                    Contains("all_gather on 'world'"));
  comm.barrier();
}

TEST_CASE("all_gather concatenates every rank's tensor in rank order", "[mpi]") {
  Communicator& comm = world();
  uint64_t salt = 400;
  for (DType dtype : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16})
    for (int64_t n : kSizes) {
      ++salt;
      CAPTURE(dtype_name(dtype), n);
      Tensor in = rank_data({n, 2}, dtype, comm.rank(), salt);
      Tensor out = Tensor::zeros({comm.size() * n, 2}, dtype);
      comm.all_gather(in, out);
      for (int r = 0; r < comm.size(); ++r)
        CHECK(same_bytes(out.narrow0(r * n, n), rank_data({n, 2}, dtype, r, salt)));
    }
}

TEST_CASE("all_to_all sends chunk j to rank j", "[mpi]") {
  Communicator& comm = world();
  const int64_t size = comm.size();
  uint64_t salt = 500;
  for (DType dtype : {DType::F32, DType::I32, DType::I64, DType::BF16})
    for (int64_t n : kSizes) {
      ++salt;
      const int64_t chunk = std::max<int64_t>(1, n / size) | 1;  // in holds about n elements
      CAPTURE(dtype_name(dtype), n, chunk);
      Tensor in = rank_data({size * chunk}, dtype, comm.rank(), salt);
      Tensor out = Tensor::zeros({size * chunk}, dtype);
      comm.all_to_all(in, out);
      for (int j = 0; j < comm.size(); ++j) {
        // Chunk j of out is chunk rank() of rank j's input.
        Tensor theirs = rank_data({size * chunk}, dtype, j, salt);
        CHECK(
            same_bytes(out.narrow0(j * chunk, chunk), theirs.narrow0(comm.rank() * chunk, chunk)));
      }
    }
}

TEST_CASE("broadcast copies the root's tensor to every rank", "[mpi]") {
  Communicator& comm = world();
  const int root = comm.size() - 1;  // a non-zero root whenever there are two ranks or more
  uint64_t salt = 600;
  for (DType dtype : {DType::F32, DType::I64, DType::BF16})
    for (int64_t n : kSizes) {
      ++salt;
      CAPTURE(dtype_name(dtype), n);
      Tensor t = rank_data({n}, dtype, comm.rank(), salt);
      comm.broadcast(t, root);
      CHECK(same_bytes(t, rank_data({n}, dtype, root, salt)));
    }
  comm.barrier();
  comm.barrier();
}

TEST_CASE("send and recv pass tensors around a ring", "[mpi]") {
  Communicator& comm = world();
  Tensor t = rank_data({100003}, DType::F32, comm.rank(), 700);
  Tensor got = Tensor::zeros({100003}, DType::F32);
  if (comm.size() == 1) {
    CHECK_THROWS_WITH(comm.send(t, 0), Contains("send on 'world'"));
    CHECK_THROWS_WITH(comm.recv(got, 0), Contains("recv on 'world'"));
    return;
  }
  const int next = (comm.rank() + 1) % comm.size();
  const int prev = (comm.rank() + comm.size() - 1) % comm.size();
  // Rank 0 sends first and everyone else receives first, so the large (rendezvous) messages
  // cannot all wait for a receiver at once.
  if (comm.rank() == 0) {
    comm.send(t, next, 5);
    comm.recv(got, prev, 5);
  } else {
    comm.recv(got, prev, 5);
    comm.send(t, next, 5);
  }
  CHECK(same_bytes(got, rank_data({100003}, DType::F32, prev, 700)));
  CHECK_THROWS_WITH(comm.send(t, comm.rank()), Contains("not another rank"));
  CHECK_THROWS_WITH(comm.recv(got, comm.size()), Contains("peer rank"));
}

TEST_CASE("split makes groups whose collectives stay inside them", "[mpi]") {
  Communicator& comm = world();
  const int color = comm.rank() % 2;
  // key = -rank reverses the order inside each group.
  std::unique_ptr<Communicator> half = comm.split(color, -comm.rank(), "half");
  std::vector<int> members;  // world ranks of this group, in group-rank order
  for (int r = comm.size() - 1; r >= 0; --r)
    if (r % 2 == color) members.push_back(r);
  CHECK(half->name() == "half");
  REQUIRE(half->size() == static_cast<int>(members.size()));
  CHECK(members[static_cast<size_t>(half->rank())] == comm.rank());

  for (int64_t n : kSizes) {
    CAPTURE(n);
    Tensor t = rank_data({n}, DType::F64, comm.rank(), 800 + static_cast<uint64_t>(n));
    half->all_reduce(t);
    const Expected e =
        reduce_locally({n}, DType::F64, ReduceOp::Sum, 800 + static_cast<uint64_t>(n), members);
    CHECK(mismatches(t, e.value, e.scale, reduce_tol(DType::F64, ReduceOp::Sum, comm.size())) == 0);

    Tensor in = rank_data({n}, DType::I64, comm.rank(), 900);
    Tensor out = Tensor::zeros({half->size() * n}, DType::I64);
    half->all_gather(in, out);
    for (int g = 0; g < half->size(); ++g)
      CHECK(same_bytes(out.narrow0(g * n, n),
                       rank_data({n}, DType::I64, members[static_cast<size_t>(g)], 900)));
  }
  // A split of a split, and the world still works after the groups are gone.
  std::unique_ptr<Communicator> single = half->split(half->rank(), 0, "single");
  CHECK(single->size() == 1);
  CHECK(single->rank() == 0);
  single.reset();
  half.reset();
  Tensor one = Tensor::full({1}, 1.0, DType::I64);
  comm.all_reduce(one);
  CHECK(one.item() == comm.size());
}

TEST_CASE("argument errors are thrown locally and name the collective", "[mpi]") {
  Communicator& comm = world();
  const int64_t size = comm.size();
  const std::string group =
      "'world' (rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) + ")";
  Tensor in = Tensor::zeros({3, 2});
  CHECK_THROWS_AS(comm.all_gather(in, Tensor::zeros({size * 3 + 1, 2})), std::invalid_argument);
  CHECK_THROWS_WITH(comm.all_gather(in, Tensor::zeros({size * 3 + 1, 2})),
                    Contains("all_gather on " + group) && Contains("in f32[3, 2] on cpu") &&
                        Contains("expected out [" + std::to_string(size * 3) + ", 2]"));
  CHECK_THROWS_WITH(comm.all_gather(in, Tensor::zeros({size * 3, 2}, DType::F64)),
                    Contains("all_gather on " + group) && Contains("dtype"));
  CHECK_THROWS_WITH(comm.reduce_scatter(Tensor::zeros({size * 4, 2}), Tensor::zeros({4, 3})),
                    Contains("reduce_scatter on " + group) && Contains("out f32[4, 3]"));
  CHECK_THROWS_WITH(comm.all_to_all(Tensor::zeros({size * 2, 3}), Tensor::zeros({size * 2, 4})),
                    Contains("all_to_all on " + group) && Contains("expected out"));
  Tensor shared = Tensor::zeros({size * 4});
  CHECK_THROWS_WITH(comm.all_to_all(shared, shared), Contains("share memory"));
  CHECK_THROWS_WITH(comm.all_reduce(Tensor::zeros({4}, DType::BF16)),
                    Contains("all_reduce on " + group) && Contains("bf16"));
  CHECK_THROWS_WITH(comm.all_reduce_async(Tensor()), Contains("undefined tensor"));
  CHECK_THROWS_WITH(comm.broadcast(in, comm.size()), Contains("broadcast on " + group));
  if (comm.size() > 1)
    CHECK_THROWS_WITH(comm.reduce_scatter(Tensor::zeros({size * 4 + 1}), Tensor::zeros({4})),
                      Contains("not divisible by size"));
  comm.barrier();  // every rank is still in step
}

TEST_CASE("the local communicator is a group of one", "[mpi]") {
  std::unique_ptr<Communicator> local = make_local_communicator("tp");
  CHECK(local->rank() == 0);
  CHECK(local->size() == 1);
  CHECK(local->name() == "tp");
  Tensor t = rank_data({7}, DType::F32, 0, 1000);
  Tensor before = t.clone();
  local->all_reduce(t, ReduceOp::Max);
  local->all_reduce_async(t)->wait();
  local->broadcast(t, 0);
  local->barrier();
  CHECK(same_bytes(t, before));
  Tensor out = Tensor::zeros({7});
  local->all_gather(t, out);
  CHECK(same_bytes(out, t));
  out = Tensor::zeros({7});
  local->reduce_scatter(t, out);
  CHECK(same_bytes(out, t));
  out = Tensor::zeros({7});
  local->reduce_scatter_async(t, out)->wait();
  CHECK(same_bytes(out, t));
  out = Tensor::zeros({7});
  local->all_to_all(t, out);
  CHECK(same_bytes(out, t));
  CHECK_THROWS_WITH(local->all_gather(t, Tensor::zeros({8})),
                    Contains("all_gather on 'tp' (rank 0 of 1)") && Contains("f32[8]"));
  CHECK_THROWS_AS(local->send(t, 0), std::logic_error);
  CHECK_THROWS_AS(local->recv(t, 0), std::logic_error);
  CHECK(local->split(0, 0, "dp")->name() == "dp");
}

TEST_CASE("collective_timeout reads MOD_COLLECTIVE_TIMEOUT_S", "[mpi]") {
  EnvGuard guard({"MOD_COLLECTIVE_TIMEOUT_S"});
  CHECK(collective_timeout() == 600);
  setenv("MOD_COLLECTIVE_TIMEOUT_S", "2.5", 1);
  CHECK(collective_timeout() == 2.5);
  for (const char* bad : {"", "abc", "0", "-3", "5s", "nan", "inf"}) {
    CAPTURE(bad);
    setenv("MOD_COLLECTIVE_TIMEOUT_S", bad, 1);
    CHECK_THROWS_WITH(collective_timeout(), Contains("MOD_COLLECTIVE_TIMEOUT_S"));
  }
}

TEST_CASE("launch_info_from_env reads Open MPI, Slurm and PMIx variables", "[mpi]") {
  EnvGuard guard({"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
                  "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "PMIX_RANK",
                  "SLURM_JOB_ID", "SLURM_STEP_ID"});
  LaunchInfo info = launch_info_from_env();
  CHECK(info.source == "single process");
  CHECK(info.size == 1);

  setenv("PMIX_RANK", "3", 1);
  info = launch_info_from_env();
  CHECK(info.source == "PMIx");
  CHECK(info.rank == 3);

  setenv("SLURM_PROCID", "2", 1);
  setenv("SLURM_LOCALID", "0", 1);
  setenv("SLURM_NTASKS", "4", 1);
  info = launch_info_from_env();
  CHECK(info.source == "Slurm");
  CHECK((info.rank == 2 && info.local_rank == 0 && info.size == 4));
  setenv("SLURM_NTASKS", "2", 1);
  CHECK_THROWS_WITH(launch_info_from_env(),
                    Contains("SLURM_PROCID=2") && Contains("SLURM_NTASKS=2"));
  // A batch script's own shell (a job, no step): one process, whatever the job's task count.
  unsetenv("PMIX_RANK");
  setenv("SLURM_JOB_ID", "17", 1);
  info = launch_info_from_env();
  CHECK(info.source == "single process");
  CHECK(info.size == 1);
  setenv("SLURM_STEP_ID", "0", 1);  // started by srun: a step of the job
  setenv("SLURM_NTASKS", "4", 1);
  info = launch_info_from_env();
  CHECK((info.source == "Slurm" && info.size == 4));

  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  info = launch_info_from_env();
  CHECK(info.source == "Open MPI");
  CHECK((info.rank == 1 && info.local_rank == 1 && info.size == 2));
  for (const char* bad : {"", "x", "1x", " 1", "-1", "99999999999"}) {
    CAPTURE(bad);
    setenv("OMPI_COMM_WORLD_RANK", bad, 1);
    CHECK_THROWS_WITH(launch_info_from_env(), Contains("OMPI_COMM_WORLD_RANK='"));
  }
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  unsetenv("OMPI_COMM_WORLD_SIZE");
  CHECK_THROWS_WITH(launch_info_from_env(), Contains("OMPI_COMM_WORLD_SIZE is not"));
}

// ---- Hidden cases: each ends the job on purpose (see tests/CMakeLists.txt). ----

TEST_CASE("a collective that a peer never enters aborts the job", "[.timeout]") {
  Communicator& comm = world();
  REQUIRE(comm.size() >= 2);
  Tensor t = Tensor::zeros({1000});
  if (comm.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(120));  // a stuck rank
  } else {
    comm.all_reduce(t);
  }
  FAIL("not reached: the all_reduce should have timed out and aborted the job");
}

TEST_CASE("a rank that exits mid-collective ends the job", "[.rank_dies]") {
  Communicator& comm = world();
  REQUIRE(comm.size() >= 2);
  comm.barrier();
  if (comm.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the others start waiting
    std::_Exit(3);
  }
  Tensor t = Tensor::zeros({1000});
  comm.all_reduce(t);
  FAIL("not reached: mpirun should have ended the job");
}

TEST_CASE("an MPI error aborts the job naming the MPI call", "[.truncate]") {
  Communicator& comm = world();
  REQUIRE(comm.size() >= 2);
  // Rank 0 sends 16 elements where rank 1 expects 8: MPI reports a truncation.
  if (comm.rank() == 0) comm.send(Tensor::zeros({16}), 1, 9);
  if (comm.rank() == 1) {
    Tensor small = Tensor::zeros({8});
    comm.recv(small, 0, 9);
  }
  comm.barrier();
  FAIL("not reached: the truncated recv should have aborted the job");
}

TEST_CASE("abort in a world of one prints the message and exits with the code", "[.local_abort]") {
  world().abort("deliberate abort from the test", 3);
}
