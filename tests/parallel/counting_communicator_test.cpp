// CountingCommunicator (parallel/counting_communicator.h), as a world of one and under
// mpirun -n 2: results equal the wrapped communicator's, each collective's calls and bytes
// follow the header's table exactly, time blocked in Work::wait is kept apart from launch
// time, and split() groups report into the parent's table under their own names.
// Invariant: every rank calls the same collectives in the same order whatever a CHECK finds.
#include "parallel/counting_communicator.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/random.h"
#include "parallel/world.h"

using namespace mod;
using namespace mod::parallel;

namespace {

Tensor filled(int64_t n, double value, DType dtype = DType::F32) {
  Tensor t = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) t.set(i, value);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("bytes_sent follows the ring formulas", "[mpi]") {
  CHECK(bytes_sent(Collective::AllReduce, 4000, 1) == 0);
  CHECK(bytes_sent(Collective::AllReduce, 4000, 2) == 4000);
  CHECK(bytes_sent(Collective::AllReduceAsync, 4000, 4) == 6000);
  CHECK(bytes_sent(Collective::AllReduce, 4000, 3) == 5333);  // rounded down
  CHECK(bytes_sent(Collective::ReduceScatter, 4000, 4) == 3000);
  CHECK(bytes_sent(Collective::AllGather, 4000, 4) == 3000);
  CHECK(bytes_sent(Collective::AllToAll, 4000, 2) == 2000);
  CHECK(bytes_sent(Collective::Broadcast, 4000, 4, true) == 4000);
  CHECK(bytes_sent(Collective::Broadcast, 4000, 4, false) == 0);
  CHECK(bytes_sent(Collective::Send, 4000, 2) == 4000);
  CHECK(bytes_sent(Collective::Recv, 4000, 2) == 0);
  CHECK(bytes_sent(Collective::SendRecv, 4000, 2) == 4000);  // S: the batch's sends
  CHECK(bytes_sent(Collective::Barrier, 0, 8) == 0);
  for (size_t k = 0; k < kCollectiveCount; ++k)
    CHECK(std::string(collective_name(static_cast<Collective>(k))) != "?");
}

TEST_CASE("counted collectives give the wrapped communicator's results", "[mpi]") {
  Communicator& w = world();
  CountingCommunicator counted(w);
  CHECK(counted.rank() == w.rank());
  CHECK(counted.size() == w.size());
  CHECK(counted.name() == w.name());
  Rng rng(11 + static_cast<uint64_t>(w.rank()));
  const Tensor x = randn({1000}, rng);
  Tensor a = x.clone(), b = x.clone();
  w.all_reduce(a);
  counted.all_reduce(b);
  CHECK(same_bytes(a, b));
  Tensor ga = Tensor::empty({w.size() * 1000}), gb = Tensor::empty({w.size() * 1000});
  w.all_gather(x, ga);
  counted.all_gather(x, gb);
  CHECK(same_bytes(ga, gb));
  Tensor c = x.clone();
  counted.all_reduce_async(c)->wait();
  CHECK(same_bytes(a, c));
  Tensor sa = Tensor::empty({1000 / w.size()}), sb = Tensor::empty({1000 / w.size()});
  const Tensor in = x.narrow0(0, w.size() * (1000 / w.size()));
  w.reduce_scatter(in, sa);
  counted.reduce_scatter_async(in, sb)->wait();
  CHECK(same_bytes(sa, sb));
}

TEST_CASE("reduce_scatter_async: counted as reduce_scatter is, its wait apart", "[mpi]") {
  CountingCommunicator comm(world());
  const int n = comm.size();
  const int64_t k = 1000;  // f32 elements per rank out
  Tensor big = filled(n * k, 1.0), small = filled(k, 0.0);
  auto work = comm.reduce_scatter_async(big, small);
  work->wait();
  CHECK(work->test());  // forwarded to the wrapped Work, which is complete
  CHECK(small.at(0) == n);
  const CollectiveStats a = comm.stats().group("world")[Collective::ReduceScatterAsync];
  CHECK(a.calls == 1);
  CHECK(a.tensor_bytes == 4 * n * k);
  CHECK(a.bytes_sent == bytes_sent(Collective::ReduceScatter, 4 * n * k, n));
  CHECK(a.wait_seconds >= 0);
  CHECK(comm.stats().group("world")[Collective::ReduceScatter].calls == 0);
  CHECK(std::string(collective_name(Collective::ReduceScatterAsync)) == "reduce_scatter_async");
}

TEST_CASE("all_gather_async: counted as all_gather is; the timeline orders issue, wait, marks",
          "[mpi]") {
  CountingCommunicator comm(world());
  const int n = comm.size();
  const int64_t k = 1000;
  Tensor mine = filled(k, 2.0), all = filled(n * k, 0.0);
  comm.all_gather_async(mine, all)->wait();  // not recorded: the timeline is off
  comm.record_timeline(true);
  auto work = comm.all_gather_async(mine, all);
  comm.mark("between");
  work->wait();
  comm.all_reduce(mine);
  comm.record_timeline(false);
  comm.mark("after");  // not recorded
  CHECK(all.at(n * k - 1) == 2.0);
  const CollectiveStats a = comm.stats().group("world")[Collective::AllGatherAsync];
  CHECK(a.calls == 2);
  CHECK(a.tensor_bytes == 2 * 4 * n * k);
  CHECK(a.bytes_sent == 2 * bytes_sent(Collective::AllGather, 4 * n * k, n));
  CHECK(comm.stats().group("world")[Collective::AllGather].calls == 0);
  CHECK(std::string(collective_name(Collective::AllGatherAsync)) == "all_gather_async");
  const std::vector<TimelineEvent> tl = comm.timeline();
  REQUIRE(tl.size() == 4);
  CHECK((tl[0].kind == TimelineEvent::Issued && tl[0].collective == Collective::AllGatherAsync &&
         tl[0].tensor_bytes == 4 * n * k && tl[0].group == "world"));
  CHECK((tl[1].kind == TimelineEvent::Mark && tl[1].label == "between"));
  CHECK((tl[2].kind == TimelineEvent::Waited && tl[2].collective == Collective::AllGatherAsync));
  CHECK((tl[3].kind == TimelineEvent::Issued && tl[3].collective == Collective::AllReduce));
}

TEST_CASE("calls and bytes per collective follow the header's table", "[mpi]") {
  CountingCommunicator comm(world());
  const int n = comm.size();
  const int64_t k = 1000;  // f32 elements per rank
  const int64_t s = 4 * k;
  Tensor t = filled(k, 1.0);
  comm.all_reduce(t);
  comm.all_reduce(t, ReduceOp::Max);
  Tensor big = filled(n * k, 1.0), small = filled(k, 0.0);
  comm.reduce_scatter(big, small);
  comm.all_gather(small, big);
  Tensor out = filled(n * k, 0.0);
  comm.all_to_all(big, out);
  comm.broadcast(t, 0);
  comm.barrier();
  if (n > 1) {
    const int right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
    if (comm.rank() % 2 == 0) {
      comm.send(t, right);
      comm.recv(small, left);
    } else {
      comm.recv(small, left);
      comm.send(t, right);
    }
  }

  const Stats st = comm.stats();
  const GroupStats g = st.group("world");
  CHECK(g.size == n);
  CHECK(g[Collective::AllReduce].calls == 2);
  CHECK(g[Collective::AllReduce].tensor_bytes == 2 * s);
  CHECK(g[Collective::AllReduce].bytes_sent == 2 * (2 * (n - 1) * s / n));
  CHECK(g[Collective::ReduceScatter].tensor_bytes == n * s);
  CHECK(g[Collective::ReduceScatter].bytes_sent == (n - 1) * s);
  CHECK(g[Collective::AllGather].tensor_bytes == n * s);
  CHECK(g[Collective::AllGather].bytes_sent == (n - 1) * s);
  CHECK(g[Collective::AllToAll].bytes_sent == (n - 1) * s);
  CHECK(g[Collective::Broadcast].calls == 1);
  CHECK(g[Collective::Broadcast].bytes_sent == (comm.rank() == 0 && n > 1 ? s : 0));
  CHECK(g[Collective::Barrier].calls == 1);
  CHECK(g[Collective::Barrier].bytes_sent == 0);
  CHECK(g[Collective::Send].calls == (n > 1 ? 1 : 0));
  CHECK(g[Collective::Send].bytes_sent == (n > 1 ? s : 0));
  CHECK(g[Collective::Recv].calls == (n > 1 ? 1 : 0));
  CHECK(g[Collective::Recv].bytes_sent == 0);
  CHECK(g[Collective::AllReduceAsync].calls == 0);
  CHECK(g.total().calls == (n > 1 ? 9 : 7));
  CHECK(st.total().bytes_sent == g.total().bytes_sent);
  for (const auto& kind : g.by_kind) {
    CHECK(kind.seconds >= 0);
    CHECK(kind.wait_seconds == 0);  // only all_reduce_async waits
  }
  CHECK(st.table().find("all_to_all") != std::string::npos);

  comm.reset_stats();
  CHECK(comm.stats().total().calls == 0);
  CHECK(comm.stats().group("world").size == n);  // sizes survive a reset
}

// A pipeline stage's round of sends and receives (Communicator::send_recv, MPI's send_async
// underneath): one send_recv call of its sends' bytes, the received tensor in place; the sends'
// wait counted apart.
TEST_CASE("send_recv: one call of its sends' bytes, results as unwrapped", "[mpi]") {
  CountingCommunicator comm(world());
  const int n = comm.size();
  if (n < 2) return;
  const int right = (comm.rank() + 1) % n, left = (comm.rank() + n - 1) % n;
  Tensor mine = filled(1000, comm.rank()), got = filled(1000, -1), extra = filled(10, 2.0);
  std::unique_ptr<Work> w = comm.send_recv({{PeerTransfer::Send, mine, right, 7},
                                            {PeerTransfer::Send, extra, right, 8},
                                            {PeerTransfer::Recv, got, left, 7}});
  Tensor got_extra = filled(10, 0.0);
  comm.recv(got_extra, left, 8);
  w->wait();
  CHECK(got.at(999) == left);
  CHECK(got_extra.at(0) == 2.0);
  const GroupStats g = comm.stats().group("world");
  CHECK(g[Collective::SendRecv].calls == 1);
  CHECK(g[Collective::SendRecv].tensor_bytes == 4 * 1010);
  CHECK(g[Collective::SendRecv].bytes_sent == 4 * 1010);
  CHECK(g[Collective::Send].calls == 0);  // the batch's sends are its own, not send's
  CHECK(g[Collective::SendRecv].wait_seconds >= 0);
  CHECK(std::string(collective_name(Collective::SendRecv)) == "send_recv");
}

TEST_CASE("a failed call is not counted", "[mpi]") {
  CountingCommunicator comm(world());
  Tensor in = filled(3 * comm.size() + 1, 1.0), out = filled(1, 0.0);
  CHECK_THROWS_AS(comm.reduce_scatter(in, out), std::invalid_argument);
  CHECK(comm.stats().total().calls == 0);
}

TEST_CASE("all_reduce_async: launch counted as time in calls, wait counted apart", "[mpi]") {
  CountingCommunicator comm(world());
  const int n = comm.size();
  // Rank 1 starts 300 ms late, so rank 0's wait (not its launch) takes at least that long.
  constexpr double kDelay = 0.3;
  Tensor t = filled(1 << 16, 1.0);
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::duration<double>(kDelay));
  auto work = comm.all_reduce_async(t);
  work->wait();
  work->wait();  // a second wait is a no-op, and adds no call
  const CollectiveStats a = comm.stats().group("world")[Collective::AllReduceAsync];
  CHECK(a.calls == 1);
  CHECK(a.bytes_sent == 2 * (n - 1) * static_cast<int64_t>(t.nbytes()) / n);
  CHECK(t.at(0) == n);
  if (n > 1 && comm.rank() == 0) {
    CHECK(a.wait_seconds > 0.5 * kDelay);
    CHECK(a.seconds < 0.5 * kDelay);
  }

  // Destroyed unwaited: the destructor's implicit wait is timed as waiting.
  comm.reset_stats();
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::duration<double>(kDelay));
  comm.all_reduce_async(t).reset();
  const CollectiveStats b = comm.stats().group("world")[Collective::AllReduceAsync];
  CHECK(b.calls == 1);
  CHECK(t.at(0) == n * n);
  if (n > 1 && comm.rank() == 0) CHECK(b.wait_seconds > 0.5 * kDelay);

  // A blocking all_reduce's wait for a late peer is time in the call.
  comm.reset_stats();
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::duration<double>(kDelay));
  comm.all_reduce(t);
  const CollectiveStats c = comm.stats().group("world")[Collective::AllReduce];
  if (n > 1 && comm.rank() == 0) CHECK(c.seconds > 0.5 * kDelay);
  CHECK(c.wait_seconds == 0);
}

TEST_CASE("split groups report into the parent's table under their names", "[mpi]") {
  CountingCommunicator comm(world());
  const int n = comm.size(), r = comm.rank();
  // "dp": every rank; "tp": each rank alone.
  auto dp = comm.split(0, r, "dp");
  auto tp = comm.split(r, 0, "tp");
  REQUIRE(dynamic_cast<CountingCommunicator*>(dp.get()) != nullptr);
  CHECK(dp->name() == "dp");
  CHECK(dp->size() == n);
  CHECK(tp->size() == 1);
  Tensor t = filled(250, 1.0);
  dp->all_reduce(t);
  dp->all_reduce_async(t)->wait();
  tp->all_reduce(t);
  CHECK(t.at(0) == n * n);

  const Stats st = comm.stats();
  CHECK(st.group("world")[Collective::Split].calls == 2);
  CHECK(st.group("world")[Collective::AllReduce].calls == 0);
  const GroupStats d = st.group("dp"), p = st.group("tp");
  CHECK(d.size == n);
  CHECK(p.size == 1);
  CHECK(d[Collective::AllReduce].calls == 1);
  CHECK(d[Collective::AllReduceAsync].calls == 1);
  CHECK(d[Collective::AllReduce].bytes_sent == 2 * (n - 1) * 1000 / n);
  CHECK(p[Collective::AllReduce].calls == 1);
  CHECK(p[Collective::AllReduce].bytes_sent == 0);  // a group of one sends nothing

  // Every member of the family sees and clears the same table.
  auto& dp_counted = dynamic_cast<CountingCommunicator&>(*dp);
  CHECK(dp_counted.stats().group("tp")[Collective::AllReduce].calls == 1);
  dp_counted.reset_stats();
  CHECK(comm.stats().total().calls == 0);

  // A split of a split reports into the same table too.
  auto half = dp->split(r % 2, r, "half");
  half->barrier();
  CHECK(comm.stats().group("half")[Collective::Barrier].calls == 1);
}

TEST_CASE("an owning wrapper and snapshot differences", "[mpi]") {
  CountingCommunicator local(make_local_communicator("solo"));
  CHECK(local.size() == 1);
  CHECK(local.name() == "solo");
  Tensor t = filled(10, 2.0);
  local.all_reduce(t);
  const Stats first = local.stats();
  local.all_reduce(t);
  local.all_reduce(t);
  const Stats diff = local.stats() - first;
  CHECK(diff.group("solo")[Collective::AllReduce].calls == 2);
  CHECK(diff.group("solo")[Collective::AllReduce].tensor_bytes == 80);
  CHECK(diff.group("solo")[Collective::AllReduce].bytes_sent == 0);
  CHECK(t.at(0) == 2.0);
  CHECK(diff.group("absent").total().calls == 0);
}
