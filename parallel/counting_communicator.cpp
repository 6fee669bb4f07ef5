// The counting decorator (see counting_communicator.h).
// Invariant: every forwarded call goes to the wrapped communicator unchanged; the clock is read
// around it and the table is updated under its mutex after it returns.
#include "parallel/counting_communicator.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace mod::parallel {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kCollectiveNames[] = {
    "all_reduce", "all_reduce_async", "reduce_scatter", "reduce_scatter_async", "all_gather",
    "all_gather_async", "all_to_all", "broadcast", "barrier", "send", "recv", "split", "send_recv"};
static_assert(std::size(kCollectiveNames) == kCollectiveCount,
              "every Collective needs a name in kCollectiveNames");

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t bytes_of(const Tensor& t) {
  return static_cast<int64_t>(t.nbytes());
}

}  // namespace

const char* collective_name(Collective c) {
  const auto i = static_cast<size_t>(c);
  return i < kCollectiveCount ? kCollectiveNames[i] : "?";
}

int64_t bytes_sent(Collective c, int64_t s, int n, bool root) {
  if (n <= 1) return 0;
  switch (c) {
    case Collective::AllReduce:
    case Collective::AllReduceAsync:
      return 2 * (n - 1) * s / n;
    case Collective::ReduceScatter:
    case Collective::ReduceScatterAsync:
    case Collective::AllGather:
    case Collective::AllGatherAsync:
    case Collective::AllToAll:
      return (n - 1) * s / n;
    case Collective::Broadcast:
      return root ? s : 0;
    case Collective::Send:
    case Collective::SendRecv:
      return s;
    case Collective::Recv:
    case Collective::Barrier:
    case Collective::Split:
    case Collective::kCount:
      return 0;
  }
  return 0;
}

CollectiveStats& CollectiveStats::operator+=(const CollectiveStats& o) {
  calls += o.calls;
  tensor_bytes += o.tensor_bytes;
  bytes_sent += o.bytes_sent;
  seconds += o.seconds;
  wait_seconds += o.wait_seconds;
  return *this;
}

CollectiveStats& CollectiveStats::operator-=(const CollectiveStats& o) {
  calls -= o.calls;
  tensor_bytes -= o.tensor_bytes;
  bytes_sent -= o.bytes_sent;
  seconds -= o.seconds;
  wait_seconds -= o.wait_seconds;
  return *this;
}

CollectiveStats GroupStats::total() const {
  CollectiveStats t;
  for (const CollectiveStats& k : by_kind) t += k;
  return t;
}

GroupStats Stats::group(const std::string& name) const {
  auto it = groups.find(name);
  return it == groups.end() ? GroupStats{} : it->second;
}

CollectiveStats Stats::total() const {
  CollectiveStats t;
  for (const auto& [name, g] : groups) t += g.total();
  return t;
}

std::string Stats::table() const {
  std::string out;
  char line[200];
  std::snprintf(line, sizeof line, "%-8s %-17s %8s %12s %12s %10s %10s\n", "group", "collective",
                "calls", "MB in", "MB sent", "ms in call", "ms waiting");
  out += line;
  for (const auto& [name, g] : groups)
    for (size_t k = 0; k < kCollectiveCount; ++k) {
      const CollectiveStats& s = g.by_kind[k];
      if (s.calls == 0) continue;
      std::snprintf(line, sizeof line, "%-8s %-17s %8lld %12.4f %12.4f %10.2f %10.2f\n",
                    (name + "/" + std::to_string(g.size)).c_str(), kCollectiveNames[k],
                    static_cast<long long>(s.calls), s.tensor_bytes / 1e6, s.bytes_sent / 1e6,
                    1e3 * s.seconds, 1e3 * s.wait_seconds);
      out += line;
    }
  return out;
}

Stats operator-(const Stats& later, const Stats& earlier) {
  Stats d = later;
  for (const auto& [name, g] : earlier.groups) {
    GroupStats& into = d.groups[name];
    into.size = g.size;
    for (size_t k = 0; k < kCollectiveCount; ++k) into.by_kind[k] -= g.by_kind[k];
  }
  return d;
}

struct CountingCommunicator::Table {
  mutable std::mutex mu;
  Stats stats;
  bool recording = false;
  std::vector<TimelineEvent> timeline;

  void add(const std::string& group, int size, Collective c, const CollectiveStats& s) {
    std::lock_guard<std::mutex> lock(mu);
    GroupStats& g = stats.groups[group];
    g.size = size;
    g[c] += s;
    if (!recording) return;
    if (s.calls > 0)
      timeline.push_back({TimelineEvent::Issued, group, c, s.tensor_bytes, {}});
    else
      timeline.push_back({TimelineEvent::Waited, group, c, 0, {}});
  }
};

namespace {

// Times Work::wait into its collective's wait_seconds. A Work destroyed unwaited waits in the
// wrapped Work's destructor; that wait is timed too.
class CountingWork final : public Work {
 public:
  CountingWork(std::unique_ptr<Work> inner, std::shared_ptr<CountingCommunicator::Table> table,
               std::string group, int size, Collective kind)
      : inner_(std::move(inner)), table_(std::move(table)), group_(std::move(group)), size_(size),
        kind_(kind) {}
  ~CountingWork() override {
    if (waited_) return;
    const auto t0 = Clock::now();
    inner_.reset();
    add_wait(seconds_since(t0));
  }
  void wait() override {
    const auto t0 = Clock::now();
    inner_->wait();
    waited_ = true;
    add_wait(seconds_since(t0));
  }
  bool test() override { return inner_->test(); }  // lets MPI progress it, as unwrapped

 private:
  void add_wait(double seconds) {
    CollectiveStats s;
    s.wait_seconds = seconds;
    table_->add(group_, size_, kind_, s);
  }

  std::unique_ptr<Work> inner_;
  std::shared_ptr<CountingCommunicator::Table> table_;
  std::string group_;
  int size_;
  Collective kind_;
  bool waited_ = false;
};

}  // namespace

CountingCommunicator::CountingCommunicator(Communicator& inner)
    : CountingCommunicator(&inner, nullptr, std::make_shared<Table>()) {}

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> inner)
    : CountingCommunicator(nullptr, std::move(inner), std::make_shared<Table>()) {}

CountingCommunicator::CountingCommunicator(Communicator* inner, std::unique_ptr<Communicator> owned,
                                           std::shared_ptr<Table> table)
    : owned_(std::move(owned)), inner_(inner ? inner : owned_.get()), table_(std::move(table)) {
  if (inner_ == nullptr) throw std::invalid_argument("CountingCommunicator: nothing to wrap");
  std::lock_guard<std::mutex> lock(table_->mu);
  table_->stats.groups[inner_->name()].size = inner_->size();
}

CountingCommunicator::~CountingCommunicator() = default;

void CountingCommunicator::record(Collective c, int64_t tensor_bytes, double seconds, bool root) {
  CollectiveStats s;
  s.calls = 1;
  s.tensor_bytes = tensor_bytes;
  s.bytes_sent = bytes_sent(c, tensor_bytes, size(), root);
  s.seconds = seconds;
  table_->add(name(), size(), c, s);
}

void CountingCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  const auto t0 = Clock::now();
  inner_->all_reduce(t, op);
  record(Collective::AllReduce, bytes_of(t), seconds_since(t0));
}

std::unique_ptr<Work> CountingCommunicator::all_reduce_async(const Tensor& t, ReduceOp op) {
  const auto t0 = Clock::now();
  std::unique_ptr<Work> work = inner_->all_reduce_async(t, op);
  record(Collective::AllReduceAsync, bytes_of(t), seconds_since(t0));
  return std::make_unique<CountingWork>(std::move(work), table_, name(), size(),
                                        Collective::AllReduceAsync);
}

void CountingCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  const auto t0 = Clock::now();
  inner_->reduce_scatter(in, out, op);
  record(Collective::ReduceScatter, bytes_of(in), seconds_since(t0));
}

std::unique_ptr<Work> CountingCommunicator::reduce_scatter_async(const Tensor& in,
                                                                 const Tensor& out, ReduceOp op) {
  const auto t0 = Clock::now();
  std::unique_ptr<Work> work = inner_->reduce_scatter_async(in, out, op);
  record(Collective::ReduceScatterAsync, bytes_of(in), seconds_since(t0));
  return std::make_unique<CountingWork>(std::move(work), table_, name(), size(),
                                        Collective::ReduceScatterAsync);
}

void CountingCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  const auto t0 = Clock::now();
  inner_->all_gather(in, out);
  record(Collective::AllGather, bytes_of(out), seconds_since(t0));
}

std::unique_ptr<Work> CountingCommunicator::all_gather_async(const Tensor& in, const Tensor& out) {
  const auto t0 = Clock::now();
  std::unique_ptr<Work> work = inner_->all_gather_async(in, out);
  record(Collective::AllGatherAsync, bytes_of(out), seconds_since(t0));
  return std::make_unique<CountingWork>(std::move(work), table_, name(), size(),
                                        Collective::AllGatherAsync);
}

void CountingCommunicator::all_to_all(const Tensor& in, const Tensor& out) {
  const auto t0 = Clock::now();
  inner_->all_to_all(in, out);
  record(Collective::AllToAll, bytes_of(in), seconds_since(t0));
}

void CountingCommunicator::broadcast(const Tensor& t, int root) {
  const auto t0 = Clock::now();
  inner_->broadcast(t, root);
  record(Collective::Broadcast, bytes_of(t), seconds_since(t0), root == rank());
}

void CountingCommunicator::barrier() {
  const auto t0 = Clock::now();
  inner_->barrier();
  record(Collective::Barrier, 0, seconds_since(t0));
}

void CountingCommunicator::send(const Tensor& t, int dst, int tag) {
  const auto t0 = Clock::now();
  inner_->send(t, dst, tag);
  record(Collective::Send, bytes_of(t), seconds_since(t0));
}

void CountingCommunicator::recv(const Tensor& t, int src, int tag) {
  const auto t0 = Clock::now();
  inner_->recv(t, src, tag);
  record(Collective::Recv, bytes_of(t), seconds_since(t0));
}

std::unique_ptr<Work> CountingCommunicator::send_async(const Tensor& t, int dst, int tag) {
  const auto t0 = Clock::now();
  std::unique_ptr<Work> work = inner_->send_async(t, dst, tag);
  record(Collective::Send, bytes_of(t), seconds_since(t0));
  return std::make_unique<CountingWork>(std::move(work), table_, name(), size(), Collective::Send);
}

std::unique_ptr<Work> CountingCommunicator::send_recv(const std::vector<PeerTransfer>& transfers) {
  int64_t sent = 0;
  for (const PeerTransfer& t : transfers)
    if (t.kind == PeerTransfer::Send) sent += bytes_of(t.tensor);
  const auto t0 = Clock::now();
  std::unique_ptr<Work> work = inner_->send_recv(transfers);
  record(Collective::SendRecv, sent, seconds_since(t0));
  return std::make_unique<CountingWork>(std::move(work), table_, name(), size(),
                                        Collective::SendRecv);
}

std::unique_ptr<Communicator> CountingCommunicator::split(int color, int key,
                                                          const std::string& name) {
  const auto t0 = Clock::now();
  std::unique_ptr<Communicator> sub = inner_->split(color, key, name);
  record(Collective::Split, 0, seconds_since(t0));
  return std::unique_ptr<Communicator>(new CountingCommunicator(nullptr, std::move(sub), table_));
}

void CountingCommunicator::abort(const std::string& message, int code) {
  inner_->abort(message, code);
  std::_Exit(code);  // not reached: GCC cannot see [[noreturn]] through the virtual call
}

Stats CountingCommunicator::stats() const {
  std::lock_guard<std::mutex> lock(table_->mu);
  return table_->stats;
}

void CountingCommunicator::reset_stats() {
  std::lock_guard<std::mutex> lock(table_->mu);
  for (auto& [name, g] : table_->stats.groups) g.by_kind = {};
}

void CountingCommunicator::record_timeline(bool on) {
  std::lock_guard<std::mutex> lock(table_->mu);
  if (on && !table_->recording) table_->timeline.clear();
  table_->recording = on;
}

void CountingCommunicator::mark(std::string label) {
  std::lock_guard<std::mutex> lock(table_->mu);
  if (table_->recording)
    table_->timeline.push_back({TimelineEvent::Mark, {}, Collective::kCount, 0, std::move(label)});
}

std::vector<TimelineEvent> CountingCommunicator::timeline() const {
  std::lock_guard<std::mutex> lock(table_->mu);
  return table_->timeline;
}

}  // namespace mod::parallel
