// Loopback sockets and the per-communicator sender thread (see nccl_wire.h).
#include "nccl_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace emu::nccl {
namespace {

constexpr uint32_t kFrameMagic = 0x4d4f444e;  // "MODN"
constexpr int kPollMs = 100;                   // how often a wait looks at its stop flag

struct Frame {
  uint32_t magic = kFrameMagic;
  uint32_t pad = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;
  char op[32] = {};
};

using Clock = std::chrono::steady_clock;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

std::string errno_text(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

void set_nodelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Waits for `events` on fd in kPollMs slices; false on timeout or when `stop` is set.
bool wait_for(int fd, short events, Clock::time_point deadline, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, kPollMs);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return false;
    if (Clock::now() > deadline) return false;
  }
  return false;
}

std::string frame_text(const char* op, uint64_t bytes) {
  return std::string(op) + " of " + std::to_string(bytes) + " bytes";
}

}  // namespace

int listen_loopback(uint16_t* port, std::string* error) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = errno_text("socket");
    return -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    *error = errno_text("bind/listen on 127.0.0.1");
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

int connect_loopback(uint16_t port, double seconds, const std::atomic<bool>& stop,
                     std::string* error) {
  const Clock::time_point deadline = after(seconds);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  while (!stop.load()) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *error = errno_text("socket");
      return -1;
    }
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      set_nodelay(fd);
      return fd;
    }
    const std::string why = errno_text(("connect to 127.0.0.1:" + std::to_string(port)).c_str());
    close(fd);
    if (Clock::now() > deadline) {
      *error = why;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  *error = "aborted";
  return -1;
}

int accept_within(int listener, double seconds, const std::atomic<bool>& stop,
                  std::string* error) {
  if (!wait_for(listener, POLLIN, after(seconds), stop)) {
    *error = stop.load() ? "aborted" : "no connection in " + std::to_string(int(seconds)) + " s";
    return -1;
  }
  const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    *error = errno_text("accept");
    return -1;
  }
  set_nodelay(fd);
  return fd;
}

bool write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, size_t bytes, double seconds, const std::atomic<bool>& stop) {
  const Clock::time_point deadline = after(seconds);
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_for(fd, POLLIN, deadline, stop)) return false;
    const ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

Links::Links(int rank, std::vector<int> fds)
    : rank_(rank),
      fds_(std::move(fds)),
      sent_seq_(fds_.size(), 0),
      received_seq_(fds_.size(), 0),
      outgoing_(fds_.size()) {
  for (int fd : fds_)
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
  sender_ = std::thread([this] { run_sender(); });
}

Links::~Links() {
  shutdown();
  if (sender_.joinable()) sender_.join();
  for (int fd : fds_)
    if (fd >= 0) close(fd);
  for (int fd : wake_)
    if (fd >= 0) close(fd);
}

void Links::send(int peer, const char* op, const void* data, size_t bytes) {
  Outgoing out;
  out.bytes.resize(sizeof(Frame) + bytes);
  Frame frame;
  frame.bytes = bytes;
  std::strncpy(frame.op, op, sizeof frame.op - 1);
  if (bytes > 0) std::memcpy(out.bytes.data() + sizeof frame, data, bytes);
  {
    std::lock_guard lock(mutex_);  // the number and the queue's order agree
    frame.seq = sent_seq_[static_cast<size_t>(peer)]++;
    std::memcpy(out.bytes.data(), &frame, sizeof frame);
    outgoing_[static_cast<size_t>(peer)].push_back(std::move(out));
  }
  queued_.notify_one();
  if (wake_[1] >= 0) {
    const char byte = 1;
    (void)!write(wake_[1], &byte, 1);
  }
}

bool Links::recv(int peer, const char* op, void* out, size_t bytes, std::string* error) {
  const int fd = fds_[static_cast<size_t>(peer)];
  const std::string from = "rank " + std::to_string(rank_) + " receiving from rank " +
                           std::to_string(peer) + ": ";
  const Clock::time_point forever = Clock::time_point::max();
  auto read_exactly = [&](void* dst, size_t n) {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      if (!wait_for(fd, POLLIN, forever, stopping_)) {
        *error = from + (stopping_.load() ? "the communicator was aborted" : "poll failed");
        return false;
      }
      const ssize_t got = ::recv(fd, p, n, 0);
      if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (got <= 0) {
        const bool gone = got == 0 || errno == ECONNRESET;  // reset: it exited with data unread
        *error = from + (gone ? "the connection was closed (has the peer exited?)"
                              : errno_text("recv"));
        return false;
      }
      p += got;
      n -= static_cast<size_t>(got);
    }
    return true;
  };
  Frame frame;
  if (!read_exactly(&frame, sizeof frame)) return false;
  frame.op[sizeof frame.op - 1] = '\0';
  const uint64_t expected_seq = received_seq_[static_cast<size_t>(peer)]++;
  if (frame.magic != kFrameMagic || frame.seq != expected_seq) {
    *error = from + "a corrupt frame (message " + std::to_string(expected_seq) + ")";
    return false;
  }
  if (std::strncmp(frame.op, op, sizeof frame.op - 1) != 0 || frame.bytes != bytes) {
    *error = from + "expected " + frame_text(op, bytes) + ", the peer sent " +
             frame_text(frame.op, frame.bytes) +
             ": the ranks called different operations or sizes in the same place";
    return false;
  }
  // Through the host: a socket cannot write into device memory that is closed to the host
  // (emulator/runtime/memory.cpp opens it on a fault, which a system call does not raise).
  std::vector<char> staging(bytes);
  if (!read_exactly(staging.data(), bytes)) return false;
  if (bytes > 0) std::memcpy(out, staging.data(), bytes);
  return true;
}

bool Links::drain(double seconds) {
  std::unique_lock lock(mutex_);
  return sent_.wait_for(lock, std::chrono::duration<double>(seconds), [&] {
    if (stopping_.load() || !send_error_.empty()) return true;
    for (const auto& q : outgoing_)
      if (!q.empty()) return false;
    return true;
  });
}

void Links::shutdown() {
  if (stopping_.exchange(true)) return;
  for (int fd : fds_)
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  queued_.notify_all();
  if (wake_[1] >= 0) {
    const char byte = 1;
    (void)!write(wake_[1], &byte, 1);
  }
}

std::string Links::send_error() const {
  std::lock_guard lock(mutex_);
  return send_error_;
}

void Links::run_sender() {
  std::unique_lock lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] {
      if (stopping_.load()) return true;
      for (const auto& q : outgoing_)
        if (!q.empty()) return true;
      return false;
    });
    if (stopping_.load()) return;
    std::vector<pollfd> polls;
    std::vector<size_t> peers;
    for (size_t p = 0; p < outgoing_.size(); ++p)
      if (!outgoing_[p].empty()) {
        polls.push_back({fds_[p], POLLOUT, 0});
        peers.push_back(p);
      }
    polls.push_back({wake_[0], POLLIN, 0});
    lock.unlock();
    const int rc = poll(polls.data(), polls.size(), kPollMs);
    if (polls.back().revents & POLLIN) {
      char drain[64];
      while (read(wake_[0], drain, sizeof drain) > 0) {
      }
    }
    lock.lock();
    if (rc <= 0) continue;
    for (size_t i = 0; i + 1 < polls.size(); ++i) {
      if (polls[i].revents == 0) continue;
      auto& queue = outgoing_[peers[i]];
      while (!queue.empty()) {
        Outgoing& head = queue.front();
        const ssize_t n = ::send(fds_[peers[i]], head.bytes.data() + head.written,
                                 head.bytes.size() - head.written, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        if (n <= 0) {
          if (send_error_.empty())
            send_error_ = "rank " + std::to_string(rank_) + " sending to rank " +
                          std::to_string(peers[i]) + ": " + errno_text("send");
          queue.clear();
          sent_.notify_all();
          break;
        }
        head.written += static_cast<size_t>(n);
        if (head.written < head.bytes.size()) break;
        queue.pop_front();
      }
    }
    sent_.notify_all();
  }
}

}  // namespace emu::nccl
