// The NCCL stand-in's transport: one loopback TCP connection between every pair of ranks, and
// per communicator a sender thread, so that a send never waits for its receiver. On a GPU an
// NCCL call only enqueues work and returns; here work runs when the host synchronises, one item at
// a time (emulator/include/emu/runtime.h), so a send that waited for its receiver would deadlock
// a ring of ranks that each send before they receive, which NCCL allows. Receives wait, as a kernel
// would.
//
// Every message carries a frame (the operation, a sequence number, its size), so a rank that
// calls a different collective, or the same one with another size, than its peer gets an error
// naming both instead of the hang or garbage NCCL would give.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace emu::nccl {

// Sockets ------------------------------------------------------------------------------------
// A listening socket on 127.0.0.1 at a port the kernel picks; -1 and `error` set on failure.
int listen_loopback(uint16_t* port, std::string* error);
// A connection to 127.0.0.1:port, retried until `seconds` pass or `stop` is set; -1 then.
int connect_loopback(uint16_t port, double seconds, const std::atomic<bool>& stop,
                     std::string* error);
// The next connection on `listener` within `seconds`; -1 on timeout, on `stop` or an error.
int accept_within(int listener, double seconds, const std::atomic<bool>& stop, std::string* error);
// Whole buffers over a blocking socket (the bootstrap's handshake); false on EOF or an error.
bool write_all(int fd, const void* data, size_t bytes);
bool read_all(int fd, void* data, size_t bytes, double seconds, const std::atomic<bool>& stop);

// Links --------------------------------------------------------------------------------------
class Links {
 public:
  // fds[peer] is the connection to each peer (fds[rank] is -1); Links owns them from now on.
  Links(int rank, std::vector<int> fds);
  ~Links();
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  // Queues a copy of data[0, bytes) for `peer`, framed with `op` (an operation's name, for
  // messages); returns at once.
  void send(int peer, const char* op, const void* data, size_t bytes);
  // The next message from `peer` into out[0, bytes). It must be framed with the same `op` and
  // size; otherwise, or when the peer has gone or shutdown() was called, false with `error`.
  bool recv(int peer, const char* op, void* out, size_t bytes, std::string* error);
  // Waits until every queued message has left (at most `seconds`); false if some has not.
  // Destroying a communicator drains first: its peers may not have received yet.
  bool drain(double seconds);
  // Wakes whoever waits (receives fail, the sender stops); what ncclCommAbort starts with.
  void shutdown();
  // The first failure the sender thread met (a peer that closed its end), else empty.
  std::string send_error() const;

 private:
  struct Outgoing {
    std::vector<char> bytes;  // frame + payload
    size_t written = 0;
  };
  void run_sender();

  int rank_;
  std::vector<int> fds_;
  std::vector<uint64_t> sent_seq_, received_seq_;
  mutable std::mutex mutex_;
  std::condition_variable queued_, sent_;
  std::vector<std::deque<Outgoing>> outgoing_;
  std::string send_error_;
  std::atomic<bool> stopping_{false};
  int wake_[2] = {-1, -1};  // a pipe that interrupts the sender's poll
  std::thread sender_;
};

}  // namespace emu::nccl
