// A test communicator for device tensors without NCCL: every collective copies its device
// tensors to the host, runs the wrapped (MPI) communicator on the copies and copies results
// back. With the emulated CUDA backend it lets multi-process tests train with train.device CUDA
// on machines without a GPU. Host tensors pass straight through.
//
// A collective of device tensors is a task on the emulated device's stream: inside a captured
// step it is recorded and runs at every replay, as NCCL's kernels in a CUDA graph do. The
// tensors are checked as given, before staging, so a CPU tensor beside a device one is refused
// as NCCL's communicator refuses it (an H200 run found tp2's parameter gather mixing them,
// 2026-11-28, where staging both to the host had hidden it).
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/communicator.h"
#include "tests/support/emulated_cuda.h"

namespace mod::test {

class HostStagingCommunicator final : public parallel::Communicator {
 public:
  explicit HostStagingCommunicator(std::unique_ptr<parallel::Communicator> inner)
      : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  void all_reduce(const Tensor& t, parallel::ReduceOp op) override {
    staged({t}, [=, this] {
      Tensor h = host(t);
      inner_->all_reduce(h, op);
      back(h, t);
    });
  }
  std::unique_ptr<parallel::Work> all_reduce_async(const Tensor& t,
                                                   parallel::ReduceOp op) override {
    all_reduce(t, op);  // done (or enqueued) before it is waited on: as good a Work as any
    return std::make_unique<Done>();
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, parallel::ReduceOp op) override {
    parallel::detail::check_reduce_scatter(*this, in, out);
    staged({in, out}, [=, this] {
      Tensor h = host(out);
      inner_->reduce_scatter(host(in), h, op);
      back(h, out);
    });
  }
  std::unique_ptr<parallel::Work> reduce_scatter_async(const Tensor& in, const Tensor& out,
                                                       parallel::ReduceOp op) override {
    reduce_scatter(in, out, op);  // staged like all_reduce_async: done (or enqueued) at once
    return std::make_unique<Done>();
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    parallel::detail::check_all_gather(*this, in, out);
    staged({in, out}, [=, this] {
      Tensor h = host(out);
      inner_->all_gather(host(in), h);
      back(h, out);
    });
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    parallel::detail::check_all_to_all(*this, in, out);
    staged({in, out}, [=, this] {
      Tensor h = host(out);
      inner_->all_to_all(host(in), h);
      back(h, out);
    });
  }
  void broadcast(const Tensor& t, int root) override {
    staged({t}, [=, this] {
      Tensor h = host(t);
      inner_->broadcast(h, root);
      back(h, t);
    });
  }
  void barrier() override { inner_->barrier(); }
  void send(const Tensor& t, int dst, int tag) override {
    staged({t}, [=, this] { inner_->send(host(t), dst, tag); });
  }
  void recv(const Tensor& t, int src, int tag) override {
    staged({t}, [=, this] {
      Tensor h = host(t);
      inner_->recv(h, src, tag);
      back(h, t);
    });
  }
  // As one NCCL group: the sends start, the receives complete, then the sends (a rank's comm
  // stream waits for the whole group, the rule pipeline_schedule_test's rendezvous checks).
  std::unique_ptr<parallel::Work> send_recv(
      const std::vector<parallel::PeerTransfer>& transfers) override {
    bool device = false;
    for (const auto& t : transfers) device = device || t.tensor.device() != Device::CPU;
    if (!device) return inner_->send_recv(transfers);
    emulate_cuda().enqueue_host_task([=, this] {
      std::vector<parallel::PeerTransfer> staged_transfers;
      for (const auto& t : transfers)
        staged_transfers.push_back({t.kind, host(t.tensor), t.peer, t.tag});
      inner_->send_recv(staged_transfers)->wait();
      for (size_t k = 0; k < transfers.size(); ++k)
        if (transfers[k].kind == parallel::PeerTransfer::Recv)
          back(staged_transfers[k].tensor, transfers[k].tensor);
    });
    return std::make_unique<Done>();
  }
  std::unique_ptr<parallel::Communicator> split(int color, int key,
                                                const std::string& name) override {
    return std::make_unique<HostStagingCommunicator>(inner_->split(color, key, name));
  }
  [[noreturn]] void abort(const std::string& message, int code) override {
    inner_->abort(message, code);
    std::abort();  // not reached: the wrapped communicator ends the job
  }

 private:
  struct Done final : parallel::Work {
    void wait() override {}
    bool test() override { return true; }
  };
  // Host tensors' collectives run now; device tensors' go on the emulated stream.
  template <typename F>
  static void staged(std::initializer_list<Tensor> tensors, F&& collective) {
    bool device = false;
    for (const Tensor& t : tensors) device = device || (t.defined() && t.device() != Device::CPU);
    if (device)
      emulate_cuda().enqueue_host_task(std::forward<F>(collective));
    else
      collective();
  }
  static Tensor host(const Tensor& t) {
    return t.defined() && t.device() != Device::CPU ? t.to(Device::CPU) : t;
  }
  static void back(const Tensor& h, const Tensor& t) {
    if (!t.defined() || t.device() == Device::CPU) return;
    Tensor dst = t;
    dst.copy_from(h);
  }

  std::unique_ptr<parallel::Communicator> inner_;
};

}  // namespace mod::test
