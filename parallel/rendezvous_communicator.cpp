// Communicator over a Rendezvous (see rendezvous_communicator.h): each collective gathers every
// rank's bytes and computes its result locally, the same on every rank.
#include "parallel/rendezvous_communicator.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "parallel/world.h"

namespace mod::parallel {

namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

template <typename T>
void reduce_into(T* acc, const T* x, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) switch (op) {
      case ReduceOp::Sum:
        acc[i] += x[i];
        break;
      case ReduceOp::Max:
        acc[i] = x[i] > acc[i] ? x[i] : acc[i];
        break;
      case ReduceOp::Min:
        acc[i] = x[i] < acc[i] ? x[i] : acc[i];
        break;
    }
}

// acc <- acc op x, elementwise over `bytes` of dtype (bf16 is refused by check_tensor).
void reduce_bytes(std::string& acc, const std::string& x, DType dtype, ReduceOp op) {
  const size_t n = acc.size() / dtype_size(dtype);
  switch (dtype) {
    case DType::F32:
      return reduce_into(reinterpret_cast<float*>(acc.data()),
                         reinterpret_cast<const float*>(x.data()), n, op);
    case DType::F64:
      return reduce_into(reinterpret_cast<double*>(acc.data()),
                         reinterpret_cast<const double*>(x.data()), n, op);
    case DType::I32:
      return reduce_into(reinterpret_cast<int32_t*>(acc.data()),
                         reinterpret_cast<const int32_t*>(x.data()), n, op);
    case DType::I64:
      return reduce_into(reinterpret_cast<int64_t*>(acc.data()),
                         reinterpret_cast<const int64_t*>(x.data()), n, op);
    case DType::BF16:
      break;
  }
  throw std::logic_error("rendezvous communicator: cannot reduce " +
                         std::string(dtype_name(dtype)));
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), t.nbytes());
}

class RendezvousCommunicator final : public Communicator {
 public:
  RendezvousCommunicator(std::unique_ptr<Rendezvous> r, std::string name)
      : r_(std::move(r)), name_(std::move(name)) {}
  int rank() const override { return r_->rank(); }
  int size() const override { return r_->size(); }
  const std::string& name() const override { return name_; }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    on_host("all_reduce", t, true);
    const std::string reduced = reduce("all_reduce", t, op);
    std::memcpy(t.raw_data(), reduced.data(), reduced.size());
  }
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override {
    all_reduce(t, op);  // control traffic: done at once
    return std::make_unique<DoneWork>();
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    detail::check_reduce_scatter(*this, in, out);
    on_host("reduce_scatter", in, true);
    const std::string reduced = reduce("reduce_scatter", in, op);
    std::memcpy(out.raw_data(), reduced.data() + rank() * out.nbytes(), out.nbytes());
  }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out,
                                             ReduceOp op) override {
    reduce_scatter(in, out, op);  // as all_reduce_async: done at once
    return std::make_unique<DoneWork>();
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    detail::check_all_gather(*this, in, out);
    on_host("all_gather", in, false);
    const auto all = gather("all_gather", in);
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<char*>(out.raw_data()) + r * in.nbytes(), all[r].data(),
                  in.nbytes());
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    detail::check_all_to_all(*this, in, out);
    on_host("all_to_all", in, false);
    const auto all = gather("all_to_all", in);
    const size_t chunk = in.nbytes() / size();
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<char*>(out.raw_data()) + r * chunk, all[r].data() + rank() * chunk,
                  chunk);
  }
  void broadcast(const Tensor& t, int root) override {
    on_host("broadcast", t, false);
    detail::check_peer("broadcast", *this, root, true);
    const std::string blob = r_->broadcast(rank() == root ? bytes_of(t) : std::string(), root);
    if (blob.size() != t.nbytes())
      throw std::invalid_argument(detail::collective_where("broadcast", *this) + ": root sent " +
                                  std::to_string(blob.size()) + " bytes, " + describe(t) +
                                  " holds " + std::to_string(t.nbytes()));
    std::memcpy(t.raw_data(), blob.data(), blob.size());
  }
  void barrier() override { r_->barrier(); }
  void send(const Tensor&, int, int) override { no_point_to_point("send"); }
  void recv(const Tensor&, int, int) override { no_point_to_point("recv"); }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return make_rendezvous_communicator(r_->split(color, key), name);
  }
  [[noreturn]] void abort(const std::string& message, int code) override {
    std::fflush(stdout);
    std::fprintf(stderr, "modtrain: rank %d: %s\n", launch_info().rank, message.c_str());
    std::fflush(stderr);
    r_->abort("rank " + std::to_string(launch_info().rank) + " ended the job: " + message);
    std::_Exit(code);
  }

 private:
  void on_host(const char* what, const Tensor& t, bool reduction) const {
    detail::check_tensor(what, *this, t, reduction);
    if (t.device() != Device::CPU)
      throw std::invalid_argument(detail::collective_where(what, *this) + ": " + describe(t) +
                                  " is on " + device_name(t.device()) +
                                  "; the rendezvous communicator carries CPU tensors (device "
                                  "tensors go over NCCL)");
  }
  // Every rank's bytes of t, each checked to be as long as this rank's.
  std::vector<std::string> gather(const char* what, const Tensor& t) {
    auto all = r_->all_gather(bytes_of(t), what);
    for (int r = 0; r < size(); ++r)
      if (all[r].size() != t.nbytes())
        throw std::invalid_argument(detail::collective_where(what, *this) + ": rank " +
                                    std::to_string(r) + " passed " + std::to_string(all[r].size()) +
                                    " bytes, this rank " + describe(t) + " (" +
                                    std::to_string(t.nbytes()) + " bytes)");
    return all;
  }
  std::string reduce(const char* what, const Tensor& t, ReduceOp op) {
    auto all = gather(what, t);
    for (int r = 1; r < size(); ++r) reduce_bytes(all[0], all[r], t.dtype(), op);
    return std::move(all[0]);
  }
  [[noreturn]] void no_point_to_point(const char* what) const {
    throw std::logic_error(detail::collective_where(what, *this) +
                           ": the rendezvous communicator has no point-to-point messages "
                           "(control traffic only); start the job under MPI for them");
  }

  std::unique_ptr<Rendezvous> r_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_rendezvous_communicator(std::unique_ptr<Rendezvous> rendezvous,
                                                           const std::string& name) {
  return std::make_unique<RendezvousCommunicator>(std::move(rendezvous), name);
}

}  // namespace mod::parallel
