// NCCL communicator tests (tests/CMakeLists.txt: nccl_tests, run alone and under mpirun -n 2).
// Values are small integers made from rank numbers (plus 2^40 for i64), so every sum, max and
// min is exact in every dtype whatever order NCCL reduces in, and every check is an exact
// comparison after a copy back to the host.
// Each case first asks whether every rank can have a GPU of its own (NCCL cannot put two ranks
// on one GPU); if not, it prints "nccl_tests: skipped: needs N GPUs, found M" and passes without
// checking anything, and when every case skipped the process exits 77, which CTest reports as
// skipped. In a world of one each case also runs on a one-rank NCCL communicator, so a single
// GPU exercises the NCCL path (streams, events, watchdog), not only the group-of-one copies.
// Invariant: a failed check never changes which collectives a rank calls next (CHECK, not
// REQUIRE), so one failure cannot desynchronise the ranks into a hang.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/cuda/device.h"
#include "parallel/nccl_communicator.h"
#include "parallel/world.h"

using namespace mod;
using namespace mod::parallel;
using Catch::Matchers::Contains;

namespace {

const std::vector<int64_t> kSizes = {1, 1000, 100003};

int g_cases = 0;    // cases that asked have_gpus()
int g_skipped = 0;  // ... and were skipped

// At exit (after mpi_main has finalised MPI and returned 0: a skipped case asserts nothing, so
// it cannot fail): 77 when every case skipped. _Exit skips the remaining exit handlers, which
// is why stdio is flushed first.
void exit_77_if_all_skipped() {
  if (g_cases > 0 && g_skipped == g_cases) {
    std::fflush(nullptr);
    std::_Exit(77);
  }
}

// True when every rank of the world can have a GPU of its own: the GPUs on the node with the
// fewest are at least the ranks on the fullest node (local ranks are 0, 1, ... per node). Both
// come from one max-reduction over the world's CPU path, so every rank decides the same and
// none is left alone in an NCCL call.
bool have_gpus() {
  ++g_cases;
  Communicator& w = world();
  // With a NCCL_HOSTID of its own each rank is a node to NCCL, and ranks may share a GPU
  // (scripts/launch_local_ranks.sh --nccl-hostids): one GPU is enough then.
  const int local_rank = std::getenv("NCCL_HOSTID") ? 0 : launch_info().local_rank;
  Tensor need_found = Tensor::from_indices(
      {local_rank + 1, -static_cast<int64_t>(cuda::device_count())}, {2});
  w.all_reduce(need_found, ReduceOp::Max);
  const int64_t need = need_found.data<int64_t>()[0];
  const int64_t found = -need_found.data<int64_t>()[1];
  if (found >= need) return true;
  if (w.rank() == 0)
    std::printf("nccl_tests: skipped: needs %lld GPUs, found %lld\n", static_cast<long long>(need),
                static_cast<long long>(found));
  if (++g_skipped == 1) std::atexit(exit_77_if_all_skipped);
  return false;
}

// The communicators a case runs on: the world wrapped for NCCL and, in a world of one, a
// one-rank NCCL communicator too (the plain wrapper makes none for a group of one).
std::vector<std::unique_ptr<Communicator>> nccl_groups() {
  Communicator& w = world();
  std::vector<std::unique_ptr<Communicator>> groups;
  groups.push_back(make_nccl_communicator(w.split(0, w.rank(), "nccl")));
  if (w.size() == 1) groups.push_back(make_nccl_communicator(w.split(0, 0, "nccl1"), true));
  return groups;
}

// Element i of rank r's values in case `salt`: an integer in [-11, 11] moved by 5 per rank, up
// for even i and down for odd i (so max and min come from different ranks); i64 adds
// 2^40 x (r + 1) so that all 64 bits travel.
std::vector<double> values(const Shape& shape, DType dtype, int rank, int salt) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<double>(static_cast<int64_t>((i * 7 + static_cast<size_t>(salt) * 3) % 23) -
                               11) +
           (i % 2 == 0 ? 5.0 : -5.0) * rank;
    if (dtype == DType::I64) v[i] += std::ldexp(1.0, 40) * (rank + 1);
  }
  return v;
}

Tensor rank_tensor(const Shape& shape, DType dtype, int rank, int salt,
                   Device device = Device::CUDA) {
  return Tensor::from_vector(values(shape, dtype, rank, salt), shape, dtype).to(device);
}

// The reduction over ranks 0 .. size-1 of values(), in double (exact for these values).
std::vector<double> reduced(const Shape& shape, DType dtype, ReduceOp op, int salt, int size) {
  std::vector<double> out = values(shape, dtype, 0, salt);
  for (int r = 1; r < size; ++r) {
    const std::vector<double> x = values(shape, dtype, r, salt);
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = op == ReduceOp::Sum   ? out[i] + x[i]
               : op == ReduceOp::Max ? std::max(out[i], x[i])
                                     : std::min(out[i], x[i]);
  }
  return out;
}

// Elements of `got` (read back to the host) that differ from `want`; a size mismatch counts
// every element.
int64_t mismatches(const Tensor& got, const std::vector<double>& want) {
  const std::vector<double> g = got.to_vector();
  if (g.size() != want.size()) return static_cast<int64_t>(std::max(g.size(), want.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i] != want[i]) ++bad;
  return bad;
}

std::vector<double> slice(const std::vector<double>& v, int64_t begin, int64_t length) {
  return {v.begin() + begin, v.begin() + begin + length};
}

}  // namespace

TEST_CASE("NCCL all_reduce: sum, max and min of every dtype", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    int salt = 0;
    for (DType dtype : {DType::F32, DType::BF16, DType::I64, DType::F64, DType::I32})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min})
        for (int64_t n : kSizes) {
          ++salt;
          CAPTURE(comm->name(), dtype_name(dtype), reduce_op_name(op), n);
          Tensor t = rank_tensor({n}, dtype, comm->rank(), salt);
          comm->all_reduce(t, op);
          CHECK(t.device() == Device::CUDA);
          CHECK(mismatches(t, reduced({n}, dtype, op, salt, comm->size())) == 0);
        }
  }
}

TEST_CASE("NCCL collectives run after earlier kernels and before later ones", "[mpi][cuda]") {
  if (!have_gpus()) return;
  // 32 Mi floats: a fill or scale runs long enough that a collective not ordered after the
  // fill, or a scale not ordered after the collective, would meet stale values.
  const int64_t n = int64_t{1} << 25;
  for (const auto& comm : nccl_groups()) {
    CAPTURE(comm->name());
    const double sum = comm->size() * (comm->size() + 1) / 2.0;  // of rank + 1 over the group
    Tensor t = Tensor::empty({n}, DType::F32, Device::CUDA);
    backend_of(t).fill(t, comm->rank() + 1);
    comm->all_reduce(t);
    backend_of(t).scale(t, 2.0, t);
    CHECK(mismatches(t, std::vector<double>(static_cast<size_t>(n), 2 * sum)) == 0);

    backend_of(t).fill(t, comm->rank() + 1);
    std::unique_ptr<Work> work = comm->all_reduce_async(t);
    work->wait();
    backend_of(t).scale(t, 3.0, t);
    CHECK(mismatches(t, std::vector<double>(static_cast<size_t>(n), 3 * sum)) == 0);
  }
}

// train.cuda_graph's multi-rank step: the collectives captured with kernels around them run at
// every replay, in order, on the values the kernels before them wrote; test() of a captured
// Work says false without querying its event (a query would break the capture).
TEST_CASE("NCCL collectives captured in a CUDA graph run at every replay", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    CAPTURE(comm->name());
    const int64_t n = 100003;
    const double sum = comm->size() * (comm->size() + 1) / 2.0;  // of rank + 1 over the group
    Tensor t = Tensor::empty({n}, DType::F32, Device::CUDA);
    Tensor u = Tensor::empty({n * comm->size()}, DType::F32, Device::CUDA);
    Tensor r = Tensor::empty({n}, DType::F32, Device::CUDA);
    Tensor step = Tensor::zeros({n}, DType::F32, Device::CUDA);  // +1 at every replay
    const Tensor ones = Tensor::full({n}, 1.0, DType::F32, Device::CUDA);
    Backend& be = backend(Device::CUDA);
    be.fill(t, 0.0);
    comm->all_reduce(t);  // NCCL's connections exist before the capture, as after warm-up
    be.begin_capture();
    be.axpy(1.0, ones, step);
    be.fill(t, comm->rank() + 1);
    be.axpy(1.0, step, t);  // rank + 1 + replay
    std::unique_ptr<Work> work = comm->all_reduce_async(t);
    const bool tested = work->test();
    work->wait();
    comm->all_gather(t, u);  // every rank's reduced copy
    be.scale(u, 0.5, u);
    std::unique_ptr<Work> scatter = comm->reduce_scatter_async(u, r);  // size x a chunk of u
    const bool scatter_tested = scatter->test();
    scatter->wait();
    std::unique_ptr<CapturedWork> graph = be.end_capture();
    // A group of one without NCCL has nothing to wait for: its Work is done at once.
    if (comm->size() > 1 || comm->name() == std::string("nccl1")) {
      CHECK_FALSE(tested);
      CHECK_FALSE(scatter_tested);
    }
    for (int replay = 1; replay <= 3; ++replay) {
      CAPTURE(replay);
      graph->replay();
      comm->watch_enqueued("replayed test graph");
      const double want = 0.5 * (sum + comm->size() * replay);
      CHECK(mismatches(u, std::vector<double>(static_cast<size_t>(n * comm->size()), want)) == 0);
      CHECK(mismatches(r, std::vector<double>(static_cast<size_t>(n), comm->size() * want)) == 0);
    }
  }
}

TEST_CASE("NCCL all_reduce_async: several outstanding, waited out of order", "[mpi][cuda]") {
  if (!have_gpus()) return;
  struct Case {
    Shape shape;
    DType dtype;
    ReduceOp op;
    int salt;
  };
  const std::vector<Case> cases = {
      {{100003}, DType::F32, ReduceOp::Sum, 201}, {{7, 3}, DType::BF16, ReduceOp::Max, 202},
      {{1000}, DType::I64, ReduceOp::Min, 203},   {{1}, DType::F32, ReduceOp::Sum, 204},
      {{33, 31}, DType::I32, ReduceOp::Sum, 205}, {{4096}, DType::F64, ReduceOp::Max, 206}};
  for (const auto& comm : nccl_groups()) {
    CAPTURE(comm->name());
    std::vector<Tensor> tensors;
    std::vector<std::unique_ptr<Work>> works;
    for (const Case& c : cases) {
      tensors.push_back(rank_tensor(c.shape, c.dtype, comm->rank(), c.salt));
      works.push_back(comm->all_reduce_async(tensors.back(), c.op));
    }
    // test() reports completion without blocking the host; give it a minute.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool finished = works[0]->test();
    while (!finished && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      finished = works[0]->test();
    }
    CHECK(finished);
    // Wait out of order; the last work is never waited and completes in its destructor.
    for (size_t i = works.size() - 1; i-- > 0;) works[i]->wait();
    works[1]->wait();  // a second wait is a no-op
    works.clear();
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      CAPTURE(i);
      CHECK(mismatches(tensors[i], reduced(c.shape, c.dtype, c.op, c.salt, comm->size())) == 0);
    }
  }
}

TEST_CASE("NCCL reduce_scatter gives each rank its chunk of the reduction", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    const int64_t size = comm->size();
    int salt = 300;
    for (DType dtype : {DType::F32, DType::BF16, DType::I64})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min})
        for (int64_t rows : {1, 333})
          for (int64_t cols : {1, 3}) {
            ++salt;
            CAPTURE(comm->name(), dtype_name(dtype), reduce_op_name(op), rows, cols);
            const Shape in_shape = {size * rows, cols};
            Tensor in = rank_tensor(in_shape, dtype, comm->rank(), salt);
            Tensor out = Tensor::full({rows, cols}, -7, dtype, Device::CUDA);
            comm->reduce_scatter(in, out, op);
            const std::vector<double> all = reduced(in_shape, dtype, op, salt, comm->size());
            CHECK(mismatches(out, slice(all, comm->rank() * rows * cols, rows * cols)) == 0);
          }
  }
}

// ZeRO-1's gradient buckets: reduce_scatter_async with several outstanding, the input freed by
// the caller before the wait (the Work holds it). Captured: the CUDA-graph case above.
TEST_CASE("NCCL reduce_scatter_async: outstanding, waited out of order", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    CAPTURE(comm->name());
    const int64_t size = comm->size();
    std::vector<Tensor> outs;
    std::vector<std::vector<double>> want;
    std::vector<std::unique_ptr<Work>> works;
    int salt = 500;
    for (DType dtype : {DType::F32, DType::BF16})
      for (int64_t rows : {1, 100003}) {
        ++salt;
        const Shape in_shape = {size * rows};
        outs.push_back(Tensor::full({rows}, -7, dtype, Device::CUDA));
        works.push_back(comm->reduce_scatter_async(
            rank_tensor(in_shape, dtype, comm->rank(), salt), outs.back()));
        want.push_back(slice(reduced(in_shape, dtype, ReduceOp::Sum, salt, comm->size()),
                             comm->rank() * rows, rows));
      }
    for (size_t i = works.size(); i-- > 0;) works[i]->wait();
    for (size_t i = 0; i < outs.size(); ++i) {
      CAPTURE(i);
      CHECK(mismatches(outs[i], want[i]) == 0);
    }
  }
}

TEST_CASE("NCCL all_gather concatenates every rank's tensor in rank order", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    int salt = 400;
    for (DType dtype : {DType::F32, DType::BF16, DType::I32, DType::I64, DType::F64})
      for (int64_t n : kSizes) {
        ++salt;
        CAPTURE(comm->name(), dtype_name(dtype), n);
        Tensor in = rank_tensor({n, 2}, dtype, comm->rank(), salt);
        Tensor out = Tensor::zeros({comm->size() * n, 2}, dtype, Device::CUDA);
        comm->all_gather(in, out);
        std::vector<double> want;
        for (int r = 0; r < comm->size(); ++r) {
          const std::vector<double> theirs = values({n, 2}, dtype, r, salt);
          want.insert(want.end(), theirs.begin(), theirs.end());
        }
        CHECK(mismatches(out, want) == 0);
      }
  }
}

// ZeRO-3's prefetch: all_gather_async with several outstanding, waited out of order, each output
// what all_gather gives (the inputs go out of scope before the wait: the Work holds them).
TEST_CASE("NCCL all_gather_async: outstanding, waited out of order", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    CAPTURE(comm->name());
    std::vector<Tensor> outs;
    std::vector<std::vector<double>> want;
    std::vector<std::unique_ptr<Work>> works;
    int salt = 600;
    for (DType dtype : {DType::F32, DType::BF16})
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{100003}}) {
        ++salt;
        outs.push_back(Tensor::full({comm->size() * n}, -7, dtype, Device::CUDA));
        works.push_back(comm->all_gather_async(rank_tensor({n}, dtype, comm->rank(), salt),
                                               outs.back()));
        want.emplace_back();
        for (int r = 0; r < comm->size(); ++r) {
          const std::vector<double> theirs = values({n}, dtype, r, salt);
          want.back().insert(want.back().end(), theirs.begin(), theirs.end());
        }
      }
    for (size_t i = works.size(); i-- > 0;) works[i]->wait();
    for (size_t i = 0; i < outs.size(); ++i) {
      CAPTURE(i);
      CHECK(mismatches(outs[i], want[i]) == 0);
    }
  }
}

TEST_CASE("NCCL all_to_all sends chunk j to rank j", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    const int64_t size = comm->size();
    int salt = 500;
    for (DType dtype : {DType::F32, DType::BF16, DType::I32, DType::I64})
      for (int64_t chunk : {1, 7, 50001}) {
        ++salt;
        CAPTURE(comm->name(), dtype_name(dtype), chunk);
        Tensor in = rank_tensor({size * chunk}, dtype, comm->rank(), salt);
        Tensor out = Tensor::zeros({size * chunk}, dtype, Device::CUDA);
        comm->all_to_all(in, out);
        // Chunk j of out is chunk rank() of rank j's in.
        std::vector<double> want;
        for (int j = 0; j < comm->size(); ++j) {
          const std::vector<double> theirs =
              slice(values({size * chunk}, dtype, j, salt), comm->rank() * chunk, chunk);
          want.insert(want.end(), theirs.begin(), theirs.end());
        }
        CHECK(mismatches(out, want) == 0);
      }
  }
}

TEST_CASE("NCCL broadcast copies the root's tensor to every rank", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    const int root = comm->size() - 1;  // a non-zero root whenever there are two ranks
    int salt = 600;
    for (DType dtype : {DType::F32, DType::BF16, DType::I64})
      for (int64_t n : kSizes) {
        ++salt;
        CAPTURE(comm->name(), dtype_name(dtype), n);
        Tensor t = rank_tensor({n}, dtype, comm->rank(), salt);
        comm->broadcast(t, root);
        CHECK(mismatches(t, values({n}, dtype, root, salt)) == 0);
      }
    CHECK_THROWS_WITH(comm->broadcast(rank_tensor({3}, DType::F32, 0, 0), comm->size()),
                      Contains("broadcast on '" + comm->name() + "'"));
  }
}

TEST_CASE("NCCL send and recv pass tensors around a ring, in call order", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    CAPTURE(comm->name());
    const int rank = comm->rank(), size = comm->size();
    Tensor a = rank_tensor({100003}, DType::F32, rank, 700);
    Tensor b = rank_tensor({5}, DType::I64, rank, 701);
    Tensor got_a = Tensor::zeros({100003}, DType::F32, Device::CUDA);
    Tensor got_b = Tensor::zeros({5}, DType::I64, Device::CUDA);
    if (size == 1) {
      CHECK_THROWS_WITH(comm->send(a, 0), Contains("send on '" + comm->name() + "'"));
      CHECK_THROWS_WITH(comm->recv(got_a, 0), Contains("recv on '" + comm->name() + "'"));
      continue;
    }
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    // Rank 0 sends first and every other rank receives first, so no two ranks wait on each
    // other's send. Two messages each way: NCCL matches them in call order (no tags).
    if (rank == 0) {
      comm->send(a, next, 5);
      comm->send(b, next, 6);
      comm->recv(got_a, prev, 5);
      comm->recv(got_b, prev, 6);
    } else {
      comm->recv(got_a, prev, 5);
      comm->recv(got_b, prev, 6);
      comm->send(a, next, 5);
      comm->send(b, next, 6);
    }
    CHECK(mismatches(got_a, values({100003}, DType::F32, prev, 700)) == 0);
    CHECK(mismatches(got_b, values({5}, DType::I64, prev, 701)) == 0);
    CHECK_THROWS_WITH(comm->send(a, rank), Contains("not another rank"));
    CHECK_THROWS_WITH(comm->recv(got_a, size), Contains("peer rank"));
    CHECK_THROWS_WITH(comm->send(a, next, -1), Contains("negative tag"));
  }
}

TEST_CASE("NCCL split: groups by parity and one group in reverse order", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    CAPTURE(comm->name());
    const int rank = comm->rank(), size = comm->size(), parity = rank % 2;
    // Ranks 0, 2, ... and 1, 3, ...: groups of one at two ranks.
    std::unique_ptr<Communicator> half = comm->split(parity, rank, "parity");
    CHECK(half->name() == "parity");
    CHECK(half->size() == (size + 1 - parity) / 2);
    CHECK(half->rank() == rank / 2);
    double want = 0;
    for (int r = parity; r < size; r += 2) want += r + 1;
    Tensor t = Tensor::full({5}, rank + 1, DType::F32, Device::CUDA);
    half->all_reduce(t);
    CHECK(mismatches(t, std::vector<double>(5, want)) == 0);

    // Every rank, keyed in reverse: the new NCCL communicator's ranks follow the key.
    std::unique_ptr<Communicator> reversed = comm->split(0, size - 1 - rank, "reversed");
    CHECK(reversed->size() == size);
    CHECK(reversed->rank() == size - 1 - rank);
    Tensor in = Tensor::full({2}, rank, DType::I64, Device::CUDA);
    Tensor out = Tensor::zeros({2 * int64_t{size}}, DType::I64, Device::CUDA);
    reversed->all_gather(in, out);
    std::vector<double> order;
    for (int k = 0; k < size; ++k) order.insert(order.end(), 2, static_cast<double>(size - 1 - k));
    CHECK(mismatches(out, order) == 0);
  }
}

TEST_CASE("NCCL wrapper: CPU tensors go to the host communicator", "[mpi][cuda]") {
  if (!have_gpus()) return;
  for (const auto& comm : nccl_groups()) {
    CAPTURE(comm->name());
    const int size = comm->size();
    const std::string where = " on '" + comm->name() + "'";
    Tensor t = rank_tensor({1000}, DType::F32, comm->rank(), 900, Device::CPU);
    comm->all_reduce(t);
    CHECK(t.device() == Device::CPU);
    CHECK(mismatches(t, reduced({1000}, DType::F32, ReduceOp::Sum, 900, size)) == 0);
    Tensor gathered = Tensor::zeros({size * int64_t{1000}}, DType::F32);
    comm->all_gather(t, gathered);
    for (int r = 0; r < size; ++r)
      CHECK(mismatches(gathered.narrow0(r * 1000, 1000), t.to_vector()) == 0);
    comm->barrier();
    // The host's rules hold on the CPU path: no bf16 reduction there (NCCL reduces bf16).
    CHECK_THROWS_WITH(comm->all_reduce(Tensor::zeros({4}, DType::BF16)), Contains("cannot reduce"));
    // One CPU and one CUDA tensor is an error naming the collective.
    Tensor on_gpu = Tensor::zeros({size * int64_t{1000}}, DType::F32, Device::CUDA);
    CHECK_THROWS_WITH(comm->all_gather(t, on_gpu),
                      Contains("all_gather" + where) && Contains("one CPU and one CUDA tensor"));
    // Shapes are checked on CUDA tensors before NCCL is called (bf16 included).
    Tensor in = Tensor::zeros({size * int64_t{4}}, DType::BF16, Device::CUDA);
    Tensor wrong = Tensor::zeros({3}, DType::BF16, Device::CUDA);
    CHECK_THROWS_WITH(comm->reduce_scatter(in, wrong),
                      Contains("reduce_scatter" + where) && Contains("expected out [4]"));
    CHECK_THROWS_WITH(comm->all_to_all(in, wrong), Contains("all_to_all" + where));
  }
  // The host communicator itself (MPI's, or the rendezvous one without MPI) refuses CUDA
  // tensors (a world of one is the local communicator, which copies them).
  if (world().size() > 1) {
    Tensor g = Tensor::zeros({4}, DType::F32, Device::CUDA);
    CHECK_THROWS_WITH(world().all_reduce(g),
                      Contains("is on cuda") &&
                          (Contains("the MPI backend moves host memory only") ||
                           Contains("the rendezvous communicator carries CPU tensors")));
  }
}
