// Host labels and watch sockets for naming a lost peer (see mpi_peer_watch.h).
// Invariant: nothing is ever written to a watch socket, so it turns readable only when the
// peer's kernel closes it (EOF or reset): the peer process is gone.
#include "parallel/mpi_peer_watch.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <cstring>
#include <thread>

#include "parallel/mpi_communicator.h"

namespace mod::parallel {

namespace {
std::atomic<bool> g_finalizing{false};

// Blocks in poll() on every watch socket and names a peer the moment its socket closes: the
// launcher kills the survivors about a second after a loss, often before they reach a
// collective, so waiting for one to notice would lose the message.
void report_lost_peers(int me, std::vector<int> sockets, std::vector<std::string> hosts) {
  std::vector<pollfd> fds;
  std::vector<int> rank_of;
  for (size_t r = 0; r < sockets.size(); ++r)
    if (sockets[r] >= 0) {
      fds.push_back({sockets[r], POLLIN | POLLRDHUP, 0});
      rank_of.push_back(static_cast<int>(r));
    }
  for (size_t open = fds.size(); open > 0;) {
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char byte = 0;
      const ssize_t got = recv(fds[i].fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) continue;
      if (g_finalizing) return;  // peers leave after MPI_Finalize's fence: no loss
      std::fprintf(stderr, "modtrain: rank %d: lost peer rank %d (host %s): its process exited or was killed\n",
                   me, rank_of[i], hosts[static_cast<size_t>(rank_of[i])].c_str());
      std::fflush(stderr);
      fds[i].fd = -1;  // poll ignores it from now on
      --open;
    }
  }
}

struct Endpoint {  // exchanged as raw bytes; every rank runs the same binary
  char host[96];
  uint32_t ip_be;  // 0: this rank cannot be watched
  uint16_t port_be;
};

struct WatchState {
  std::vector<std::string> hosts;  // by world rank
  std::vector<int> sockets;        // by world rank; -1 for self and unwatched peers
};

WatchState& watch_state() {
  static WatchState s;
  return s;
}

// The first IPv4 address of this rank's Open MPI daemon ("749142016.1;tcp://10.0.0.7,...:port"):
// the address mpirun reaches this node on, so peers can reach it too.
std::string daemon_address() {
  const char* uri = std::getenv("OMPI_MCA_orte_local_daemon_uri");
  const char* p = uri != nullptr ? std::strstr(uri, "tcp://") : nullptr;
  if (p == nullptr) return "";
  std::string address;
  for (p += 6; *p != '\0' && *p != ',' && *p != ':' && *p != ';'; ++p) address += *p;
  return address;
}

uint32_t resolve_ipv4(const std::string& address, const std::string& hostname) {
  in_addr a{};
  if (!address.empty() && inet_pton(AF_INET, address.c_str(), &a) == 1) return a.s_addr;
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  if (getaddrinfo(hostname.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return 0;
  const uint32_t ip = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr.s_addr;
  freeaddrinfo(found);
  return ip;
}

// A listening socket on every address, port chosen by the kernel; -1 on failure. It stays open
// for the life of the process: when the process dies, queued peer connections are reset.
int open_listener(uint16_t* port_be) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, SOMAXCONN) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length) != 0) {
    close(fd);
    return -1;
  }
  *port_be = a.sin_port;
  return fd;
}

// Non-blocking connect with a deadline, so an unreachable peer costs seconds, not minutes.
int connect_within(uint32_t ip_be, uint16_t port_be,
                   std::chrono::steady_clock::time_point deadline) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = ip_be;
  a.sin_port = port_be;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  if (errno == EINPROGRESS) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t length = sizeof error;
    if (left.count() > 0 && poll(&p, 1, static_cast<int>(left.count())) == 1 &&
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0)
      return fd;
  }
  close(fd);
  return -1;
}

}  // namespace

void start_peer_watch(MpiCommunicator& world) {
  WatchState& s = watch_state();
  const int n = world.size(), me = world.rank();
  char hostname[64] = "?";
  gethostname(hostname, sizeof hostname - 1);
  const std::string address = daemon_address();
  const std::string label = address.empty() ? hostname : std::string(hostname) + "/" + address;

  Endpoint mine{};
  std::snprintf(mine.host, sizeof mine.host, "%s", label.c_str());
  if (n <= kMaxWatchedWorld && open_listener(&mine.port_be) >= 0)
    mine.ip_be = resolve_ipv4(address, hostname);
  std::vector<Endpoint> all(static_cast<size_t>(n));
  MPI_Request request;
  world.check(MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE,
                             world.handle(), &request),
              "MPI_Iallgather");
  world.wait(request, "peer watch setup");

  s.hosts.assign(static_cast<size_t>(n), "?");
  s.sockets.assign(static_cast<size_t>(n), -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int unwatched = 0;
  for (int r = 0; r < n; ++r) {
    s.hosts[r].assign(all[r].host, strnlen(all[r].host, sizeof all[r].host));
    if (r == me || all[r].ip_be == 0) continue;
    // A host name may resolve to loopback (Debian's 127.0.1.1): usable only on the same host.
    const bool loopback = (ntohl(all[r].ip_be) >> 24) == 127;
    if (loopback && std::strncmp(all[r].host, mine.host, sizeof mine.host) != 0) {
      ++unwatched;
      continue;
    }
    s.sockets[r] = connect_within(all[r].ip_be, all[r].port_be, deadline);
    if (s.sockets[r] < 0) ++unwatched;
  }
  if (unwatched > 0)
    std::fprintf(stderr,
                 "modtrain: rank %d: cannot open watch sockets to %d peer(s): a peer that dies "
                 "will not be named\n",
                 me, unwatched);
  std::thread(report_lost_peers, me, s.sockets, s.hosts).detach();
}

void stop_peer_watch() { g_finalizing = true; }

std::string peer_host(int world_rank) {
  const WatchState& s = watch_state();
  if (world_rank < 0 || world_rank >= static_cast<int>(s.hosts.size())) return "?";
  return s.hosts[world_rank];
}

int find_lost_peer(const std::vector<int>& world_ranks) {
  const WatchState& s = watch_state();
  for (const int r : world_ranks) {
    if (r < 0 || r >= static_cast<int>(s.sockets.size()) || s.sockets[r] < 0) continue;
    pollfd p{s.sockets[r], POLLIN, 0};
    if (poll(&p, 1, 0) != 1) continue;
    char byte = 0;
    const ssize_t got = recv(s.sockets[r], &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      return r;
  }
  return -1;
}

}  // namespace mod::parallel
