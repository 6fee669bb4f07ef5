// IPv4 TCP sockets with deadlines (see tcp_socket.h): every blocking step is a poll() bounded
// by the caller's deadline, so no rendezvous step waits forever on a peer that never comes.
#include "parallel/tcp_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace mod::parallel::tcp {

namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

// Milliseconds until `deadline`, at least 0, at most 1 s (poll re-checks the clock).
int ms_until(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1000));
}

// Waits for `events` on fd; false once the deadline passes first.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_until(deadline));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) throw std::runtime_error("poll: " + errno_text(errno));
    if (Clock::now() >= deadline) return false;
  }
}

sockaddr_in ipv4(const std::string& address, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1)
    throw std::invalid_argument("'" + address + "' is not a numeric IPv4 address");
  return a;
}

// host (a name or a numeric address) -> its first IPv4 address. A name that does not resolve
// is an error at once; a temporary failure (EAI_AGAIN) is retried by the caller.
bool resolve(const std::string& host, std::string& address, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    error = ::gai_strerror(rc);
    if (rc != EAI_AGAIN) throw std::runtime_error("'" + host + "' does not resolve: " + error);
    return false;
  }
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text,
              sizeof text);
  ::freeaddrinfo(found);
  address = text;
  return true;
}

void no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small control messages
}

}  // namespace

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    peer_ = std::move(o.peer_);
    o.fd_ = -1;
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Socket::local_address() const {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("getsockname: " + errno_text(errno));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
  return text;
}

int Socket::local_port() const {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("getsockname: " + errno_text(errno));
  return ntohs(a.sin_port);
}

void Socket::send_all(const void* data, size_t bytes, Clock::time_point deadline,
                      const char* what) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!wait_for(fd_, POLLOUT, deadline))
      throw std::runtime_error(std::string(what) + ": " + peer_ + " took no data in time");
    const ssize_t n = ::send(fd_, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0)
      throw std::runtime_error(std::string(what) + ": sending to " + peer_ + ": " +
                               errno_text(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void Socket::recv_all(void* data, size_t bytes, Clock::time_point deadline, const char* what) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_for(fd_, POLLIN, deadline))
      throw std::runtime_error(std::string(what) + ": nothing from " + peer_ + " in time");
    const ssize_t n = ::recv(fd_, p, bytes, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0)
      throw std::runtime_error(std::string(what) + ": " + peer_ +
                               " closed the connection (its process exited?)");
    if (n < 0)
      throw std::runtime_error(std::string(what) + ": receiving from " + peer_ + ": " +
                               errno_text(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

long Socket::recv_now(void* data, size_t bytes, const char* what) {
  for (;;) {
    const ssize_t n = ::recv(fd_, data, bytes, MSG_DONTWAIT);
    if (n >= 0) return static_cast<long>(n);
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
    if (errno != EINTR)
      throw std::runtime_error(std::string(what) + ": receiving from " + peer_ + ": " +
                               errno_text(errno));
  }
}

bool Socket::readable(int ms) const {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

Socket listen_on(const std::string& address, int port, int backlog) {
  const std::string where = address + ":" + std::to_string(port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw std::runtime_error("socket: " + errno_text(errno));
  Socket s(fd, where);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // a restarted job's port
  const sockaddr_in a = ipv4(address, port);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    throw std::runtime_error("cannot listen on " + where + ": " + errno_text(errno));
  if (::listen(fd, backlog) != 0)
    throw std::runtime_error("cannot listen on " + where + ": " + errno_text(errno));
  return s;
}

Socket accept_until(Socket& listener, Clock::time_point deadline) {
  while (wait_for(listener.fd(), POLLIN, deadline)) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    const int fd = ::accept4(listener.fd(), reinterpret_cast<sockaddr*>(&a), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      throw std::runtime_error("accept on " + listener.peer() + ": " + errno_text(errno));
    }
    no_delay(fd);
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
    return Socket(fd, std::string(text) + ":" + std::to_string(ntohs(a.sin_port)));
  }
  return Socket();
}

Socket connect_until(const std::string& host, int port, Clock::time_point deadline,
                     const std::string& because) {
  const std::string where = host + ":" + std::to_string(port) + " (" + because + ")";
  std::string error = "no attempt";
  for (;;) {
    std::string address;
    if (resolve(host, address, error)) {
      // Non-blocking, so an address that drops SYNs costs the deadline, not the kernel's minutes.
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) throw std::runtime_error("socket: " + errno_text(errno));
      Socket s(fd, host + ":" + std::to_string(port));
      const sockaddr_in a = ipv4(address, port);
      int err = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        err = ETIMEDOUT;
        if (wait_for(fd, POLLOUT, deadline)) {
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        }
      }
      if (err == 0) {
        no_delay(fd);
        return s;
      }
      error = errno_text(err);
      if (err != ECONNREFUSED && err != ETIMEDOUT && err != ENETUNREACH && err != EHOSTUNREACH &&
          err != EINTR && err != ECONNRESET)
        throw std::runtime_error("cannot connect to " + where + ": " + error);
    }
    if (Clock::now() >= deadline)
      throw std::runtime_error("nothing listens at " + where + " (last try: " + error + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_until(deadline))));
  }
}

}  // namespace mod::parallel::tcp
