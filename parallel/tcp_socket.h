// Blocking IPv4 TCP sockets with deadlines, for the rendezvous (parallel/rendezvous.h). Every
// wait is bounded: a call that cannot finish by its deadline throws, naming the peer and what
// it waited for. Errors are std::runtime_error with the address and errno's text.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

namespace mod::parallel::tcp {

using Clock = std::chrono::steady_clock;
Clock::time_point deadline_after(double seconds);

// An owned socket descriptor (closed on destruction), with the address it talks to for messages.
class Socket {
 public:
  Socket() = default;
  Socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_), peer_(std::move(o.peer_)) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();

  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  const std::string& peer() const { return peer_; }
  // The numeric IPv4 address of this end of a connected (or bound) socket.
  std::string local_address() const;
  int local_port() const;

  // Whole buffers or a throw: EOF and errors name the peer; past `deadline` the message says
  // `what` was not done in time. send never raises SIGPIPE.
  void send_all(const void* data, size_t bytes, Clock::time_point deadline, const char* what);
  void recv_all(void* data, size_t bytes, Clock::time_point deadline, const char* what);
  // Reads what has arrived without waiting: the bytes read (> 0), 0 once the peer closed, -1
  // when nothing is there yet. Errors throw, naming the peer.
  long recv_now(void* data, size_t bytes, const char* what);
  // True when a read would not block (data or EOF) within `ms` milliseconds (0: just look).
  bool readable(int ms) const;

 private:
  int fd_ = -1;
  std::string peer_;
};

// A socket listening on `address` ("0.0.0.0" for every interface) and `port` (0: the kernel
// picks one; local_port() says which). Throws naming address:port (e.g. the port is in use).
// Non-blocking, so accepting never hangs on a connection that went away after poll saw it.
Socket listen_on(const std::string& address, int port, int backlog);
// The next connection, or an empty Socket once `deadline` passes (a past deadline: only one
// already waiting, as a non-blocking accept).
Socket accept_until(Socket& listener, Clock::time_point deadline);
// Connects to host:port, retrying while nothing listens there yet (refused, unreachable,
// timed out) until `deadline`; then throws, naming host:port, `because` (what told us the
// address, e.g. "MASTER_ADDR=node1 MASTER_PORT=29500") and the last error.
Socket connect_until(const std::string& host, int port, Clock::time_point deadline,
                     const std::string& because);

}  // namespace mod::parallel::tcp
