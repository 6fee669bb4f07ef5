// The parts of the communicator layer every build has: reduce-op names, the collective timeout,
// the argument checks shared by all backends, and the local communicator (a group of one).
// Invariant: the local communicator checks its arguments exactly as the MPI one does, so a
// wrong shape fails at world size 1 on a laptop, not first on the cluster.
#include "parallel/communicator.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace mod::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

std::unique_ptr<Work> Communicator::send_async(const Tensor&, int, int) {
  throw std::logic_error(detail::collective_where("send_async", *this) +
                         ": this backend has no non-blocking send (the MPI backend has)");
}

namespace {
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};
}  // namespace

std::unique_ptr<Work> Communicator::all_gather_async(const Tensor& in, const Tensor& out) {
  all_gather(in, out);
  return std::make_unique<DoneWork>();
}

namespace {
// The sends of a send_recv, waited together.
class SendsWork final : public Work {
 public:
  explicit SendsWork(std::vector<std::unique_ptr<Work>> sends) : sends_(std::move(sends)) {}
  void wait() override {
    for (auto& w : sends_) w->wait();
    sends_.clear();
  }
  bool test() override {
    for (auto& w : sends_)
      if (!w->test()) return false;
    return true;
  }

 private:
  std::vector<std::unique_ptr<Work>> sends_;
};
}  // namespace

std::unique_ptr<Work> Communicator::send_recv(const std::vector<PeerTransfer>& transfers) {
  std::vector<std::unique_ptr<Work>> sends;
  for (const PeerTransfer& t : transfers)
    if (t.kind == PeerTransfer::Send) sends.push_back(send_async(t.tensor, t.peer, t.tag));
  for (const PeerTransfer& t : transfers)
    if (t.kind == PeerTransfer::Recv) recv(t.tensor, t.peer, t.tag);
  return std::make_unique<SendsWork>(std::move(sends));
}

double seconds_from_env(const char* var, double default_seconds) {
  const char* text = std::getenv(var);
  if (text == nullptr) return default_seconds;
  char* end = nullptr;
  errno = 0;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || errno != 0 || !std::isfinite(seconds) || seconds <= 0)
    throw std::invalid_argument("environment: " + std::string(var) + "='" + std::string(text) +
                                "' is not a positive number of seconds");
  return seconds;
}

double collective_timeout() { return seconds_from_env("MOD_COLLECTIVE_TIMEOUT_S", 600); }

namespace detail {

std::string collective_where(const char* collective, const Communicator& comm) {
  return std::string(collective) + " on '" + comm.name() + "' (rank " +
         std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) + ")";
}

void check_tensor(const char* collective, const Communicator& comm, const Tensor& t,
                  bool reduction) {
  if (!t.defined())
    throw std::invalid_argument(collective_where(collective, comm) + ": undefined tensor");
  if (reduction && t.dtype() == DType::BF16)
    throw std::invalid_argument(collective_where(collective, comm) + ": cannot reduce " +
                                describe(t) + "; reduce in f32 and convert");
}

namespace {

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// The checks common to the two-tensor collectives; `expect` is out's required shape.
void check_in_out(const char* collective, const Communicator& comm, const Tensor& in,
                  const Tensor& out, bool reduction, const Shape& expect, const char* rule) {
  check_tensor(collective, comm, in, reduction);
  check_tensor(collective, comm, out, reduction);
  const std::string where = collective_where(collective, comm);
  const std::string both = "in " + describe(in) + ", out " + describe(out);
  if (in.dtype() != out.dtype() || in.device() != out.device())
    throw std::invalid_argument(where + ": in and out differ in dtype or device: " + both);
  if (in.dim() < 1) throw std::invalid_argument(where + ": needs at least one dimension: " + both);
  if (out.shape() != expect)
    throw std::invalid_argument(where + ": " + both + "; expected out " + shape_str(expect) + " (" +
                                rule + ", size " + std::to_string(comm.size()) + ")");
  if (overlap(in, out)) throw std::invalid_argument(where + ": in and out share memory: " + both);
}

}  // namespace

void check_reduce_scatter(const Communicator& comm, const Tensor& in, const Tensor& out,
                          const char* what) {
  check_tensor(what, comm, in, true);
  if (in.dim() >= 1 && in.size(0) % comm.size() != 0)
    throw std::invalid_argument(collective_where(what, comm) + ": in " + describe(in) +
                                " has a first dimension not divisible by size " +
                                std::to_string(comm.size()));
  Shape expect = in.shape();
  if (!expect.empty()) expect[0] /= comm.size();
  check_in_out(what, comm, in, out, true, expect, "in [size * n, ...] -> out [n, ...]");
}

void check_all_gather(const Communicator& comm, const Tensor& in, const Tensor& out) {
  const char* what = "all_gather";
  check_tensor(what, comm, in, false);
  Shape expect = in.shape();
  if (!expect.empty()) expect[0] *= comm.size();
  check_in_out(what, comm, in, out, false, expect, "in [n, ...] -> out [size * n, ...]");
}

void check_all_to_all(const Communicator& comm, const Tensor& in, const Tensor& out) {
  const char* what = "all_to_all";
  check_tensor(what, comm, in, false);
  if (in.dim() >= 1 && in.size(0) % comm.size() != 0)
    throw std::invalid_argument(collective_where(what, comm) + ": in " + describe(in) +
                                " has a first dimension not divisible by size " +
                                std::to_string(comm.size()));
  check_in_out(what, comm, in, out, false, in.shape(), "in, out [size * n, ...]");
}

void check_peer(const char* what, const Communicator& comm, int peer, bool self_ok) {
  if (peer < 0 || peer >= comm.size() || (!self_ok && peer == comm.rank()))
    throw std::invalid_argument(collective_where(what, comm) + ": peer rank " +
                                std::to_string(peer) + " is not " +
                                (self_ok ? "in the group" : "another rank of the group"));
}

}  // namespace detail

namespace {

class LocalWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// A group of one. Tensors may live on any device: the copies go through the tensor backend.
class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  void all_reduce(const Tensor& t, ReduceOp) override {
    detail::check_tensor("all_reduce", *this, t, true);
  }
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp) override {
    detail::check_tensor("all_reduce_async", *this, t, true);
    return std::make_unique<LocalWork>();
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp) override {
    detail::check_reduce_scatter(*this, in, out);
    Tensor(out).copy_from(in);
  }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out,
                                             ReduceOp) override {
    detail::check_reduce_scatter(*this, in, out, "reduce_scatter_async");
    Tensor(out).copy_from(in);
    return std::make_unique<LocalWork>();
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    detail::check_all_gather(*this, in, out);
    Tensor(out).copy_from(in);
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    detail::check_all_to_all(*this, in, out);
    Tensor(out).copy_from(in);
  }
  void broadcast(const Tensor& t, int root) override {
    detail::check_tensor("broadcast", *this, t, false);
    detail::check_peer("broadcast", *this, root, true);
  }
  void barrier() override {}
  void send(const Tensor&, int dst, int) override {
    throw std::logic_error(detail::collective_where("send", *this) + ": no peer rank " +
                           std::to_string(dst) + " in a group of one");
  }
  void recv(const Tensor&, int src, int) override {
    throw std::logic_error(detail::collective_where("recv", *this) + ": no peer rank " +
                           std::to_string(src) + " in a group of one");
  }
  std::unique_ptr<Communicator> split(int, int, const std::string& name) override {
    return std::make_unique<LocalCommunicator>(name);
  }
  [[noreturn]] void abort(const std::string& message, int code) override {
    std::fflush(stdout);
    std::fprintf(stderr, "modtrain: rank 0: %s\n", message.c_str());
    std::fflush(stderr);
    std::_Exit(code);
  }

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator(const std::string& name) {
  return std::make_unique<LocalCommunicator>(name);
}

}  // namespace mod::parallel
