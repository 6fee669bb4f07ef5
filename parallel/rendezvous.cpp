// The rendezvous (see rendezvous.h): meeting (serve on rank 0, join elsewhere, the published
// file of the file method), all_gather through rank 0, split and abort.
#include "parallel/rendezvous.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "core/util/atomic_file.h"
#include "parallel/rendezvous_wire.h"

namespace mod::parallel {

using tcp::Clock;
using tcp::deadline_after;
using wire::Kind;

struct Rendezvous::Peer {
  int rank;
  tcp::Socket socket;
};

namespace {

namespace fs = std::filesystem;

std::string seconds_str(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// File names and the published line carry the token with anything but [A-Za-z0-9._-] as '_'.
std::string sanitized(const std::string& token) {
  std::string out = token.empty() ? "job" : token;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return out;
}

std::string random_nonce() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex << device() << device() << device() << device();
  return out.str();
}

std::string published_path(const RendezvousOptions& o) {
  return o.file_dir + "/modtrain-rendezvous-" + sanitized(o.token);
}

struct Published {
  std::string nonce, host;
  int port = 0;
};

// Replaced atomically (core/util/atomic_file.h): a reader sees the old file or the new one.
void publish(const RendezvousOptions& o, const Published& p) {
  const std::string line = "modtrain-rendezvous 1 " + sanitized(o.token) + ' ' + p.nonce + ' ' +
                           p.host + ' ' + std::to_string(p.port) + '\n';
  try {
    util::replace_file(published_path(o), line);
  } catch (const std::exception& e) {
    throw std::runtime_error("rendezvous: " + std::string(e.what()) + " (--rendezvous file:" +
                             o.file_dir + " must be a writable directory on storage every node "
                             "shares)");
  }
}

// This job's published line, or nothing yet (no file, or another token's).
std::optional<Published> read_published(const RendezvousOptions& o) {
  std::ifstream in(published_path(o));
  std::string magic, version, token;
  Published p;
  if (!(in >> magic >> version >> token >> p.nonce >> p.host >> p.port)) return std::nullopt;
  if (magic != "modtrain-rendezvous" || version != "1" || token != sanitized(o.token))
    return std::nullopt;
  return p;
}

std::string hello(const RendezvousOptions& o, const std::string& nonce) {
  std::string payload =
      wire::Writer().i64(o.rank).i64(o.size).str(o.token).str(o.host).str(nonce).take();
  if (payload.size() > wire::kMaxHello)  // rank 0 would drop it as a stranger's
    throw std::invalid_argument("rendezvous: rank " + std::to_string(o.rank) + "'s hello is " +
                                std::to_string(payload.size()) + " bytes, more than the " +
                                std::to_string(wire::kMaxHello) +
                                " rank 0 reads before it knows a peer; shorten the job token "
                                "(MOD_RENDEZVOUS_TOKEN) or the host name");
  return payload;
}

// Before its hello a connection may be a port scanner or another job: it may send kMaxHello
// bytes (rendezvous_wire.h) within kHelloWaitS, and at most kMaxWaiting such connections are
// held at once (~0.5 MiB), all polled together so none delays another.
constexpr double kHelloWaitS = 2;
constexpr int kMaxWaiting = 128;
constexpr int kMaxDropLogs = 100;  // a scan of the port logs this many lines, then one more

// A connection on rank 0's port that has not said a valid hello yet.
struct Waiting {
  tcp::Socket socket;
  Clock::time_point deadline;
  uint64_t header[3] = {};
  size_t header_got = 0;
  std::string payload;  // sized only once the header passed: at most kMaxHello bytes
  size_t payload_got = 0;
  bool done = false;  // admitted or dropped: forgotten at the end of the round
};

// Reads what `w` has sent so far without waiting: true once its whole hello frame is there;
// `why` says why to drop it instead (garbage, another kind first, an oversized claim, EOF).
bool read_hello(Waiting& w, std::string& why) {
  try {
    if (w.header_got < sizeof w.header) {
      const long n = w.socket.recv_now(reinterpret_cast<char*>(w.header) + w.header_got,
                                       sizeof w.header - w.header_got, "hello");
      if (n == 0) why = "closed the connection before its hello";
      if (n <= 0) return false;
      w.header_got += static_cast<size_t>(n);
      if (w.header_got < sizeof w.header) return false;
      why = wire::header_problem(w.header, wire::kMaxHello);
      if (why.empty() && static_cast<uint32_t>(w.header[0]) != static_cast<uint32_t>(Kind::Hello))
        why = "sent another message before its hello";
      if (!why.empty()) return false;
      w.payload.resize(w.header[2]);
    }
    while (w.payload_got < w.payload.size()) {
      const long n = w.socket.recv_now(w.payload.data() + w.payload_got,
                                       w.payload.size() - w.payload_got, "hello");
      if (n == 0) why = "closed the connection inside its hello";
      if (n <= 0) return false;
      w.payload_got += static_cast<size_t>(n);
    }
    return true;
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
}

// Best effort, 1 s at most: a refused peer may be gone (a small answer never waits in practice).
void tell(tcp::Socket& socket, const std::string& payload) {
  try {
    wire::send_frame(socket, Kind::Welcome, 0, payload, deadline_after(1), "welcome");
  } catch (const std::exception&) {
  }
}

}  // namespace

Rendezvous::Rendezvous(RendezvousOptions options) : options_(std::move(options)) {}
Rendezvous::~Rendezvous() = default;

std::unique_ptr<Rendezvous> Rendezvous::meet(const RendezvousOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
    throw std::invalid_argument("rendezvous: rank " + std::to_string(o.rank) + " of " +
                                std::to_string(o.size) + ": the rank must be in 0..size-1");
  std::unique_ptr<Rendezvous> r(new Rendezvous(o));
  r->hosts_ = {o.host};
  if (o.size == 1) return r;
  if (o.rank != 0) {
    r->join();
    return r;
  }
  const bool file = !o.file_dir.empty();
  tcp::Socket listener;
  try {
    listener = tcp::listen_on("0.0.0.0", file ? 0 : o.master_port, o.size + kMaxWaiting);
  } catch (const std::exception& e) {
    throw std::runtime_error("rendezvous: rank 0 " + std::string(e.what()) + " (" + o.found_by +
                             ")");
  }
  Published p{file ? random_nonce() : "", o.master_addr.empty() ? o.host : o.master_addr,
              listener.local_port()};
  if (file) publish(o, p);
  try {
    r->serve(std::move(listener), p.nonce);
  } catch (...) {
    if (file) fs::remove(published_path(o));
    throw;
  }
  if (file) fs::remove(published_path(o));  // met: no later job can mistake it for its own
  return r;
}

void Rendezvous::serve(tcp::Socket listener, const std::string& nonce) {
  const RendezvousOptions& o = options_;
  const auto deadline = deadline_after(o.timeout_s);
  std::vector<std::optional<Peer>> slots(o.size);
  hosts_.assign(o.size, "");
  hosts_[0] = o.host;
  std::vector<Waiting> waiting;       // connections yet to say a valid hello, oldest first
  std::vector<std::string> refusals;  // hellos that did not fit, named if the meeting times out
  int dropped = 0;
  auto drop = [&](Waiting& w, const std::string& why) {
    if (dropped < kMaxDropLogs)
      std::fprintf(stderr, "modtrain: rendezvous: rank 0 dropped %s: %s\n", w.socket.peer().c_str(),
                   why.c_str());
    else if (dropped == kMaxDropLogs)
      std::fprintf(stderr,
                   "modtrain: rendezvous: rank 0 dropped %d connections; no more are "
                   "logged\n",
                   kMaxDropLogs);
    ++dropped;
    w.socket = tcp::Socket();
    w.done = true;
  };
  auto forget_done = [&] {
    waiting.erase(
        std::remove_if(waiting.begin(), waiting.end(), [](const Waiting& w) { return w.done; }),
        waiting.end());
  };
  // Whether the whole hello in `w` is a rank of this meeting; if so it takes its slot.
  auto admit = [&](Waiting& w) {
    int rank = -1, size = 0;
    std::string token, host, their_nonce;
    try {
      wire::Reader in(w.payload, w.socket.peer());
      rank = static_cast<int>(in.i64());
      size = static_cast<int>(in.i64());
      token = in.str();
      host = in.str();
      their_nonce = in.str();
    } catch (const std::exception&) {
      return drop(w, "sent a malformed hello");
    }
    if (their_nonce != nonce) {  // it read a file an earlier job left: it reads again
      tell(w.socket, wire::Writer().str("stale").take());
      w.socket = tcp::Socket();
      w.done = true;
      return;
    }
    const std::string who =
        "rank " + std::to_string(rank) + " on " + host + " (" + w.socket.peer() + ")";
    std::string problem;
    if (token != o.token)
      problem = who + " belongs to another job: its token is '" + token + "', rank 0's is '" +
                o.token + "'";
    else if (size != o.size)
      problem = who + " says the world has " + std::to_string(size) + " ranks, rank 0 says " +
                std::to_string(o.size) + " (WORLD_SIZE or SLURM_NTASKS differs between ranks)";
    else if (rank < 0 || rank >= o.size)
      problem = who + " claims a rank outside 0.." + std::to_string(o.size - 1);
    else if (rank == 0 || slots[rank])
      problem = who + " claims a rank that " + (rank == 0 ? o.host + " (rank 0)" : hosts_[rank]) +
                " already has: every process needs its own RANK";
    if (!problem.empty()) {  // its sender learns why now; the meeting does not end for it
      tell(w.socket, wire::Writer().str("rendezvous: " + problem).take());
      if (refusals.size() < 4) refusals.push_back(problem);
      return drop(w, problem);
    }
    slots[rank] = Peer{rank, std::move(w.socket)};
    hosts_[rank] = host;
    w.done = true;
  };
  auto arrived = [&] {
    return static_cast<int>(std::count_if(slots.begin(), slots.end(),
                                          [](const auto& slot) { return slot.has_value(); }));
  };
  while (arrived() < o.size - 1) {
    const auto now = Clock::now();
    if (now >= deadline) {
      std::vector<int> missing;
      for (int r = 1; r < o.size; ++r)
        if (!slots[r]) missing.push_back(r);
      std::string message = "rendezvous: rank(s) " + rank_list(missing) + " of " +
                            std::to_string(o.size) + " did not reach rank 0 within " +
                            seconds_str(o.timeout_s) + " s (" + o.found_by +
                            "; MOD_RENDEZVOUS_TIMEOUT_S sets the wait)";
      for (const std::string& r : refusals) message += "; rank 0 refused " + r;
      for (Waiting& w : waiting) drop(w, "said no hello before the meeting timed out");
      const std::string refusal = wire::Writer().str(message).take();
      for (auto& slot : slots)
        if (slot) tell(slot->socket, refusal);
      throw std::runtime_error(message);
    }
    for (Waiting& w : waiting)
      if (now >= w.deadline) drop(w, "said no hello within " + seconds_str(kHelloWaitS) + " s");
    forget_done();
    std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
    auto wake = deadline;
    for (const Waiting& w : waiting) {
      fds.push_back({w.socket.fd(), POLLIN, 0});
      wake = std::min(wake, w.deadline);
    }
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<int64_t>(ms, 0, 1000))) < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("rendezvous: rank 0: poll: " + std::string(std::strerror(errno)));
    }
    for (size_t i = 0; i < waiting.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      std::string why;
      if (read_hello(waiting[i], why))
        admit(waiting[i]);
      else if (!why.empty())
        drop(waiting[i], why);
    }
    forget_done();
    // Full: the oldest stranger goes, so a flood of silent ones cannot lock a rank out.
    for (int n = 0; fds[0].revents != 0 && n < kMaxWaiting; ++n) {
      tcp::Socket s = tcp::accept_until(listener, Clock::now());
      if (!s.open()) break;
      if (waiting.size() >= static_cast<size_t>(kMaxWaiting)) {
        drop(waiting.front(), "made room: " + std::to_string(kMaxWaiting) +
                                  " connections were waiting for their hellos");
        waiting.erase(waiting.begin());
      }
      Waiting& w = waiting.emplace_back();
      w.socket = std::move(s);
      w.deadline = std::min(deadline, deadline_after(kHelloWaitS));
    }
  }
  for (Waiting& w : waiting) drop(w, "said no hello before the job met");
  wire::Writer welcome;
  welcome.str("");
  for (const std::string& h : hosts_) welcome.str(h);
  const std::string met = welcome.take();
  for (auto& slot : slots)
    if (slot) tell(slot->socket, met);
  for (int r = 1; r < o.size; ++r) peers_.push_back(std::move(*slots[r]));
  address_ = peers_[0].socket.local_address();
}

void Rendezvous::join() {
  const RendezvousOptions& o = options_;
  const bool file = !o.file_dir.empty();
  const auto deadline = deadline_after(o.timeout_s);
  const std::string late = " within " + seconds_str(o.timeout_s) +
                           " s (MOD_RENDEZVOUS_TIMEOUT_S sets the wait)";
  for (;;) {
    Published p{"", o.master_addr, o.master_port};
    std::string found_by = o.found_by;
    if (file) {
      std::optional<Published> read;
      while (!(read = read_published(o))) {
        if (Clock::now() >= deadline)
          throw std::runtime_error("rendezvous: rank " + std::to_string(o.rank) + " found no " +
                                   published_path(o) + " from rank 0 of this job" + late);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      p = *read;
      found_by = "published in " + published_path(o);
    }
    // With a file, a refused or silent address may be stale: read the file again.
    const auto attempt = file ? std::min(deadline, deadline_after(1)) : deadline;
    const std::string mine = hello(o, p.nonce);  // too long: an error now, not a retry
    tcp::Socket s;
    wire::Frame welcome;
    try {
      s = tcp::connect_until(p.host, p.port, attempt, found_by);
      wire::send_frame(s, Kind::Hello, 0, mine, deadline, "hello");
      // Rank 0 answers when all came or at its own timeout: wait past ours for that answer, so
      // every rank reports the same cause.
      welcome = wire::recv_frame(s, deadline + std::chrono::seconds(5), "rendezvous with rank 0");
    } catch (const std::exception& e) {
      if (file && Clock::now() < deadline) continue;
      throw std::runtime_error("rendezvous: rank " + std::to_string(o.rank) +
                               " cannot meet rank 0: " + e.what() +
                               (Clock::now() >= deadline ? late : ""));
    }
    wire::Reader in(welcome.payload, s.peer());
    const std::string refusal = in.str();
    if (refusal == "stale" && file) continue;
    if (welcome.kind != Kind::Welcome || !refusal.empty()) throw std::runtime_error(refusal);
    hosts_.assign(o.size, "");
    for (std::string& h : hosts_) h = in.str();
    address_ = s.local_address();
    peers_.push_back(Peer{0, std::move(s)});
    return;
  }
}

void Rendezvous::fail_everyone(const std::string& message) {
  for (Peer& p : peers_) try {
      wire::send_frame(p.socket, Kind::Abort, seq_, message, deadline_after(1), "abort");
    } catch (const std::exception&) {
    }
  throw std::runtime_error(message);
}

std::vector<std::string> Rendezvous::all_gather(const std::string& blob, const char* what) {
  if (size() == 1) return {blob};
  const auto deadline = deadline_after(options_.op_timeout_s);
  const uint64_t seq = seq_++;
  const std::string where = "rendezvous " + std::string(what) + " (collective #" +
                            std::to_string(seq) + ", rank " + std::to_string(rank()) + " of " +
                            std::to_string(size()) + ")";
  std::vector<std::string> out(size());
  if (rank() != 0) {
    tcp::Socket& root = peers_[0].socket;
    wire::Frame f;
    try {
      try {
        wire::send_frame(root, Kind::Gather, seq, blob, deadline, what);
      } catch (const std::exception&) {
        // Rank 0 may have ended the job and closed first: its abort, if it came, says why.
        std::string abort;
        try {
          const wire::Frame a = wire::recv_frame(root, deadline_after(1), what);
          if (a.kind == Kind::Abort) abort = a.payload;
        } catch (const std::exception&) {
        }
        if (!abort.empty()) throw std::runtime_error(abort);
        throw;
      }
      // Rank 0 decides a late collective and forwards its error; wait past its own timeout for
      // that answer, so every rank reports the same cause.
      f = wire::recv_frame(root, deadline + std::chrono::seconds(5), what);
    } catch (const std::exception& e) {
      throw std::runtime_error(where + ": " + e.what());
    }
    if (f.kind == Kind::Abort) throw std::runtime_error(f.payload);
    if (f.kind != Kind::Result || f.seq != seq)
      throw std::runtime_error(where + ": rank 0 answered collective #" + std::to_string(f.seq) +
                               ": the ranks called different collectives");
    wire::Reader in(f.payload, root.peer());
    for (std::string& s : out) s = in.str();
    return out;
  }
  out[0] = blob;
  std::vector<bool> got(size(), false);
  for (int pending = size() - 1; pending > 0;) {
    std::vector<pollfd> fds;
    std::vector<Peer*> waiting;
    for (Peer& p : peers_)
      if (!got[p.rank]) {
        fds.push_back({p.socket.fd(), POLLIN, 0});
        waiting.push_back(&p);
      }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0) {
      if (Clock::now() < deadline) continue;  // EINTR
      std::vector<int> missing;
      for (Peer* p : waiting) missing.push_back(p->rank);
      fail_everyone(where + ": rank(s) " + rank_list(missing) + " did not enter it within " +
                    seconds_str(options_.op_timeout_s) + " s (MOD_COLLECTIVE_TIMEOUT_S)");
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Peer& p = *waiting[i];
      wire::Frame f;
      try {
        f = wire::recv_frame(p.socket, deadline, what);
      } catch (const std::exception& e) {
        fail_everyone(where + ": rank " + std::to_string(p.rank) + ": " + e.what());
      }
      if (f.kind == Kind::Abort) fail_everyone(f.payload);
      if (f.kind != Kind::Gather || f.seq != seq)
        fail_everyone(where + ": rank " + std::to_string(p.rank) + " is at collective #" +
                      std::to_string(f.seq) + ": the ranks called different collectives");
      out[p.rank] = std::move(f.payload);
      got[p.rank] = true;
      --pending;
    }
  }
  wire::Writer result;
  for (const std::string& s : out) result.str(s);
  const std::string payload = result.take();
  for (Peer& p : peers_) try {
      wire::send_frame(p.socket, Kind::Result, seq, payload, deadline, what);
    } catch (const std::exception& e) {
      fail_everyone(where + ": rank " + std::to_string(p.rank) + ": " + e.what());
    }
  return out;
}

std::string Rendezvous::broadcast(const std::string& blob, int root) {
  if (root < 0 || root >= size())
    throw std::invalid_argument("rendezvous broadcast: root " + std::to_string(root) +
                                " outside 0.." + std::to_string(size() - 1));
  return all_gather(rank() == root ? blob : std::string(), "broadcast")[root];
}

std::unique_ptr<Rendezvous> Rendezvous::split(int color, int key) {
  const auto all = all_gather(wire::Writer().i64(color).i64(key).str(address_).take(), "split");
  struct Member {
    int64_t key;
    int rank;
    std::string address;
  };
  std::vector<Member> members;
  for (int r = 0; r < size(); ++r) {
    wire::Reader in(all[r], "rank " + std::to_string(r));
    const int64_t c = in.i64(), k = in.i64();
    std::string address = in.str();
    if (c == color) members.push_back({k, r, std::move(address)});
  }
  std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  RendezvousOptions sub = options_;
  sub.size = static_cast<int>(members.size());
  sub.rank = static_cast<int>(std::find_if(members.begin(), members.end(),
                                           [&](const Member& m) { return m.rank == rank(); }) -
                              members.begin());
  sub.token = options_.token + "/split" + std::to_string(splits_++) + "/" + std::to_string(color);
  sub.file_dir.clear();
  sub.timeout_s = options_.op_timeout_s;
  sub.master_addr = members[0].address;
  // The group's first rank listens on its own address, where this job's ranks already reach it.
  tcp::Socket listener;
  if (sub.size > 1 && sub.rank == 0) listener = tcp::listen_on(address_, 0, sub.size + kMaxWaiting);
  const auto ports =
      all_gather(wire::Writer().i64(listener.open() ? listener.local_port() : 0).take(), "split");
  sub.master_port = static_cast<int>(wire::Reader(ports[members[0].rank], "split").i64());
  sub.found_by = "split of rank " + std::to_string(members[0].rank) + "'s group";
  std::unique_ptr<Rendezvous> r(new Rendezvous(sub));
  r->hosts_ = {options_.host};
  r->address_ = address_;
  if (sub.size == 1) return r;
  if (sub.rank == 0)
    r->serve(std::move(listener), "");
  else
    r->join();
  return r;
}

void Rendezvous::abort(const std::string& message) noexcept {
  for (Peer& p : peers_) try {
      wire::send_frame(p.socket, Kind::Abort, seq_, message, deadline_after(1), "abort");
    } catch (...) {
    }
}

}  // namespace mod::parallel
