// A Communicator decorator that forwards every call to the communicator it wraps and counts,
// per group ("world", "dp", "tp") and per collective: calls, the bytes handed in, the bytes this
// rank sends, seconds inside the call and, for the async ones, seconds blocked in Work::wait.
// Benchmarks wrap the world in one to see what a training step moves and where it waits.
//
// Invariants:
// - Results are the wrapped communicator's, bit for bit: this class only times and counts.
// - A call is counted once it returns; one that throws (a bad shape) is not counted.
// - Communicators made by split() wrap the sub-communicator and report into the same table as
//   their parent, under the name given to split(); stats() and reset_stats() on any of them see
//   and clear all of it. The table is thread-safe.
//
// Bytes sent by this rank per call, for a group of n ranks and the tensor sizes S below. These
// are the volumes of the bandwidth-optimal algorithms (ring all-reduce, ring all-gather and
// reduce-scatter; NCCL's "bus bandwidth" and the Megatron-LM / ZeRO papers count the same way),
// so measured bytes compare directly with napkin math; they are not necessarily what Open MPI's
// chosen algorithm moves (for n = 2, ring and recursive doubling move exactly this):
//   all_reduce, all_reduce_async   2 (n - 1) / n x S    S = bytes of t
//   reduce_scatter(_async)         (n - 1) / n x S      S = bytes of in  (n x out)
//   all_gather(_async)             (n - 1) / n x S      S = bytes of out (n x in)
//   all_to_all                     (n - 1) / n x S      S = bytes of in  (own chunk stays)
//   broadcast                      S on the root, 0 elsewhere (what the root must send at least)
//   send, send_async / recv        S / 0
//   send_recv                      S = bytes of the batch's sends (its receives: 0)
//   barrier, split                 0 (control messages only)
// Each volume is rounded down to whole bytes per call; a group of one sends nothing.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace mod::parallel {

enum class Collective {
  AllReduce,
  AllReduceAsync,
  ReduceScatter,
  ReduceScatterAsync,
  AllGather,
  AllGatherAsync,
  AllToAll,
  Broadcast,
  Barrier,
  Send,
  Recv,
  Split,
  SendRecv,  // a batch of point-to-point sends and receives (pipeline stages' links)
  kCount
};
inline constexpr size_t kCollectiveCount = static_cast<size_t>(Collective::kCount);
const char* collective_name(Collective c);  // "all_reduce_async"

// The table above: bytes this rank sends in one call of `c` in a group of `group_size` ranks
// with tensor size `tensor_bytes` (`root`: this rank is the broadcast's root).
int64_t bytes_sent(Collective c, int64_t tensor_bytes, int group_size, bool root = false);

struct CollectiveStats {
  int64_t calls = 0;
  int64_t tensor_bytes = 0;  // sum of S (the table above)
  int64_t bytes_sent = 0;    // sum of the table's volume for this rank
  double seconds = 0;        // inside the call; for the async ones the launch only
  double wait_seconds = 0;   // async ones: blocked in Work::wait (or an unwaited destructor)

  CollectiveStats& operator+=(const CollectiveStats& o);
  CollectiveStats& operator-=(const CollectiveStats& o);
};

struct GroupStats {
  int size = 1;  // ranks in the group
  std::array<CollectiveStats, kCollectiveCount> by_kind{};

  // By value, so `stats.group("dp")[kind]` is safe to bind to a const reference.
  CollectiveStats operator[](Collective c) const { return by_kind[static_cast<size_t>(c)]; }
  CollectiveStats& operator[](Collective c) { return by_kind[static_cast<size_t>(c)]; }
  CollectiveStats total() const;  // over every kind
};

// A snapshot of the table: groups by name.
struct Stats {
  std::map<std::string, GroupStats> groups;

  // The named group's figures; all zero (size 1) when it made no call.
  GroupStats group(const std::string& name) const;
  CollectiveStats total() const;  // over every group and kind
  // One line per (group, kind) with calls: calls, MB handed in, MB sent, ms in calls, ms waiting.
  std::string table() const;
};
// later - earlier, group by group and kind by kind (for "what happened between two snapshots").
Stats operator-(const Stats& later, const Stats& earlier);

struct TimelineEvent {
  enum Kind { Issued, Waited, Mark } kind = Mark;
  std::string group;                             // Issued, Waited
  Collective collective = Collective::kCount;    // Issued, Waited
  int64_t tensor_bytes = 0;                      // Issued
  std::string label;                             // Mark
};

class CountingCommunicator final : public Communicator {
 public:
  // Wraps `inner`, which must outlive this object and everything split from it.
  explicit CountingCommunicator(Communicator& inner);
  // Wraps and owns `inner`.
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner);
  ~CountingCommunicator() override;
  CountingCommunicator(const CountingCommunicator&) = delete;
  CountingCommunicator& operator=(const CountingCommunicator&) = delete;

  // Defaults as in Communicator, so calls through this type read the same.
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::Sum) override;
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out,
                                             ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Work> all_gather_async(const Tensor& in, const Tensor& out) override;
  void all_to_all(const Tensor& in, const Tensor& out) override;
  void broadcast(const Tensor& t, int root) override;
  void barrier() override;
  void send(const Tensor& t, int dst, int tag = 0) override;
  void recv(const Tensor& t, int src, int tag = 0) override;
  std::unique_ptr<Work> send_async(const Tensor& t, int dst, int tag = 0) override;  // as send
  // Forwarded whole (NCCL groups it); counted as one send_recv call of its sends' bytes.
  std::unique_ptr<Work> send_recv(const std::vector<PeerTransfer>& transfers) override;
  // A CountingCommunicator that owns the wrapped sub-communicator and shares this one's table.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  [[noreturn]] void abort(const std::string& message, int code = 1) override;
  void watch_enqueued(const char* what) override { inner_->watch_enqueued(what); }

  Stats stats() const;  // the whole shared table
  void reset_stats();   // zeroes the whole shared table

  // The timeline, shared as the table is: while recording, every call is logged as it returns
  // (an async one: once started), every Work as its wait returns, and the caller's marks, in
  // the order they happened on this process. Tests read when a collective was in flight
  // relative to compute (ZeRO-3's prefetch); starting to record clears it.
  void record_timeline(bool on);
  void mark(std::string label);  // a TimelineEvent::Mark, when recording
  std::vector<TimelineEvent> timeline() const;
  Communicator& inner() const { return *inner_; }

  struct Table;  // the shared, locked stats table (counting_communicator.cpp)

 private:
  // Wraps `inner` if given, else `owned`.
  CountingCommunicator(Communicator* inner, std::unique_ptr<Communicator> owned,
                       std::shared_ptr<Table> table);
  void record(Collective c, int64_t tensor_bytes, double seconds, bool root = false);

  std::unique_ptr<Communicator> owned_;  // null when wrapping by reference
  Communicator* inner_;
  std::shared_ptr<Table> table_;
};

}  // namespace mod::parallel
