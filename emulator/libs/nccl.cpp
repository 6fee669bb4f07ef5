// An NCCL stand-in under the toolkit's nccl.h: ranks are processes on one machine, connected
// over loopback TCP (nccl_wire.h), their device memory the emulator's. What follows NCCL's
// documentation (NCCL User Guide, "API" and "Communicator Creation and Management"; nccl.h):
// - the unique id from ncclGetUniqueId carries what the ranks need to meet (here: rank 0's
//   loopback port and a random token); ncclCommInitRank(Config) with config.blocking = 0 returns
//   ncclInProgress and completes in the background, ncclCommGetAsyncError saying when;
// - ranks on one host that share a GPU fail init with ncclInvalidUsage and "Duplicate GPU
//   detected : rank a and rank b both on CUDA device <busId>" (NCCL >= 2.5, init.cc) unless
//   NCCL_HOSTID differs (User Guide, "Environment Variables", NCCL_HOSTID: it replaces the host
//   name in the host hash);
// - collectives and send/recv are ordered with the rest of their stream's work, so they can be
//   captured into a CUDA graph and run at each replay ("Using NCCL with CUDA Graphs");
// - between ncclGroupStart and ncclGroupEnd calls only queue; sends and receives to several
//   peers then progress together ("Group Calls", "Point-to-point communication");
// - ncclCommAbort stops a communicator whatever it is doing; a failed operation makes the
//   communicator's asynchronous error what ncclCommGetAsyncError returns.
// Reductions combine ranks in rank order on every rank, so every rank gets the same bits (NCCL's
// ring gives each rank the same bits too, in another order). Where NCCL would hang or fault, the
// stand-in fails with a message: buffers outside device memory (as NCCL_CHECK_POINTERS=1 does),
// ranks calling different operations or sizes at the same point.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "emu/runtime.h"
#include "nccl_reduce.h"
#include "nccl_wire.h"

using emu::nccl::Links;

struct ncclComm {
  int rank = 0, nranks = 0, device = 0;
  bool blocking = true;
  std::atomic<ncclResult_t> state{ncclInProgress};  // ncclInProgress while initialising
  std::atomic<bool> stopping{false};
  std::atomic<int> busy{0};
  std::mutex mutex;
  std::string last_error;
  std::unique_ptr<Links> links;
  std::thread init;
};

namespace {

constexpr double kInitSeconds = 120;  // how long a rank waits for its peers at init
constexpr char kIdMagic[8] = "MODNCCL";

struct IdContents {
  char magic[8];
  uint16_t port;
  uint64_t token;
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES);

// What each rank tells rank 0 at init, and rank 0 tells every rank back.
struct Hello {
  uint64_t token = 0;
  int32_t nranks = 0, rank = 0, device = 0;
  uint16_t port = 0;  // the rank's own listener, where higher ranks connect
  uint64_t host_hash = 0;
};
struct Reply {
  int32_t status = ncclSuccess;
  char message[256] = {};
};

std::mutex g_mutex;
std::unordered_map<uint64_t, int> g_listeners;  // ncclGetUniqueId's listeners, by token
std::set<ncclComm_t> g_live;
std::string g_last_error;

// The group being built on this thread (ncclGroupStart nests).
struct Op;
thread_local int t_group_depth = 0;
thread_local std::vector<std::shared_ptr<Op>> t_group;

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// NCCL's host hash: the host name and boot id, or NCCL_HOSTID when set.
uint64_t host_hash() {
  if (const char* id = std::getenv("NCCL_HOSTID"); id != nullptr && *id != '\0')
    return fnv1a(id);
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return fnv1a(std::string(name) + boot);
}

// The PCI bus id NCCL prints for a device ("1000" for bus 1): device d is on bus d + 1.
std::string bus_id_text(int device) {
  char text[32];
  std::snprintf(text, sizeof text, "%x", (device + 1) << 12);
  return text;
}

ncclResult_t fail(ncclComm_t comm, ncclResult_t code, const std::string& message) {
  std::lock_guard lock(g_mutex);
  g_last_error = message;
  if (comm != nullptr) {
    std::lock_guard comm_lock(comm->mutex);
    comm->last_error = message;
  }
  return code;
}

// Marks a live communicator's asynchronous error (the first one stays) and returns it.
ncclResult_t fail_async(ncclComm_t comm, ncclResult_t code, const std::string& message) {
  ncclResult_t now = comm->state.load();
  while ((now == ncclSuccess || now == ncclInProgress) &&
         !comm->state.compare_exchange_weak(now, code)) {
  }
  return fail(comm, code, message);
}

ncclResult_t check_comm(ncclComm_t comm, const char* call) {
  {
    std::lock_guard lock(g_mutex);
    if (comm == nullptr || g_live.count(comm) == 0)
      return fail(nullptr, ncclInvalidArgument,
                  std::string(call) + ": comm is not a live communicator");
  }
  const ncclResult_t state = comm->state.load();
  if (state == ncclInProgress)
    return fail(comm, ncclInvalidUsage,
                std::string(call) + ": the communicator is still initialising "
                                    "(wait for ncclCommGetAsyncError to leave ncclInProgress)");
  return state;  // a failed communicator keeps failing
}

// Init ---------------------------------------------------------------------------------------

// Rank 0: meets every rank on the unique id's listener, checks them, answers each.
ncclResult_t meet_as_root(ncclComm_t c, int listener, const Hello& mine, std::vector<int>& fds,
                          std::vector<Hello>& table) {
  table[0] = mine;
  std::string error;
  std::vector<bool> seen(static_cast<size_t>(c->nranks), false);
  seen[0] = true;
  std::string problem;
  for (int n = 1; n < c->nranks; ++n) {
    const int fd = emu::nccl::accept_within(listener, kInitSeconds, c->stopping, &error);
    if (fd < 0)
      return fail(c, ncclSystemError,
                  "ncclCommInitRank: rank 0 heard from " + std::to_string(n) + " of " +
                      std::to_string(c->nranks) + " ranks: " + error);
    Hello h;
    if (!emu::nccl::read_all(fd, &h, sizeof h, kInitSeconds, c->stopping)) {
      close(fd);
      --n;
      continue;
    }
    if (h.token != mine.token || h.rank <= 0 || h.rank >= c->nranks || seen[h.rank] ||
        h.nranks != c->nranks) {
      if (problem.empty())
        problem = "ncclCommInitRank: a rank joined with rank " + std::to_string(h.rank) +
                  " of " + std::to_string(h.nranks) + " (expected a distinct rank below " +
                  std::to_string(c->nranks) + ", with this id)";
      h.rank = -1;
    } else {
      seen[h.rank] = true;
      table[h.rank] = h;
      fds[h.rank] = fd;
      continue;
    }
    close(fd);
  }
  Reply reply;
  if (!problem.empty()) {
    reply.status = ncclInvalidUsage;
    std::strncpy(reply.message, problem.c_str(), sizeof reply.message - 1);
  }
  for (int r = 1; r < c->nranks; ++r) {
    if (fds[r] < 0) continue;
    emu::nccl::write_all(fds[r], &reply, sizeof reply);
    if (reply.status == ncclSuccess) emu::nccl::write_all(fds[r], table.data(), table.size() * sizeof(Hello));
  }
  return reply.status == ncclSuccess ? ncclSuccess
                                     : fail(c, static_cast<ncclResult_t>(reply.status), problem);
}

void initialise(ncclComm_t c, IdContents id) {
  std::string error;
  auto give_up = [&](ncclResult_t code, const std::string& message, std::vector<int>& fds) {
    for (int fd : fds)
      if (fd >= 0) close(fd);
    fail_async(c, code, message);
  };
  std::vector<int> fds(static_cast<size_t>(c->nranks), -1);
  uint16_t my_port = 0;
  const int own = emu::nccl::listen_loopback(&my_port, &error);
  if (own < 0) return give_up(ncclSystemError, "ncclCommInitRank: " + error, fds);
  Hello mine;
  mine.token = id.token;
  mine.nranks = c->nranks;
  mine.rank = c->rank;
  mine.device = c->device;
  mine.port = my_port;
  mine.host_hash = host_hash();
  std::vector<Hello> table(static_cast<size_t>(c->nranks));
  ncclResult_t rc = ncclSuccess;
  if (c->rank == 0) {
    int listener = -1;
    {
      std::lock_guard lock(g_mutex);
      auto it = g_listeners.find(id.token);
      if (it != g_listeners.end()) {
        listener = it->second;
        g_listeners.erase(it);
      }
    }
    if (listener < 0) {
      close(own);
      return give_up(ncclInvalidUsage,
                     "ncclCommInitRank: rank 0 must pass the id its own process made with "
                     "ncclGetUniqueId (each id serves one communicator)",
                     fds);
    }
    rc = meet_as_root(c, listener, mine, fds, table);
    close(listener);
  } else {
    fds[0] = emu::nccl::connect_loopback(id.port, kInitSeconds, c->stopping, &error);
    Reply reply;
    if (fds[0] < 0) {
      rc = fail(c, ncclSystemError, "ncclCommInitRank: rank " + std::to_string(c->rank) +
                                        " cannot reach rank 0: " + error);
    } else if (!emu::nccl::write_all(fds[0], &mine, sizeof mine) ||
               !emu::nccl::read_all(fds[0], &reply, sizeof reply, kInitSeconds, c->stopping)) {
      rc = fail(c, ncclSystemError,
                "ncclCommInitRank: rank " + std::to_string(c->rank) + " lost rank 0 at init");
    } else if (reply.status != ncclSuccess) {
      reply.message[sizeof reply.message - 1] = '\0';
      rc = fail(c, static_cast<ncclResult_t>(reply.status), reply.message);
    } else if (!emu::nccl::read_all(fds[0], table.data(), table.size() * sizeof(Hello),
                                    kInitSeconds, c->stopping)) {
      rc = fail(c, ncclSystemError, "ncclCommInitRank: rank 0 did not send the rank table");
    }
  }
  if (rc != ncclSuccess) {
    close(own);
    return give_up(rc, c->last_error, fds);
  }
  // Two ranks on one host on the same device: NCCL refuses the communicator. Every rank looks
  // at every pair (NCCL's ranks each check their own), so none is left waiting for a peer that
  // gave up; a rank of the pair names itself first.
  for (int a = 0; a < c->nranks; ++a)
    for (int b = a + 1; b < c->nranks; ++b)
      if (table[a].host_hash == table[b].host_hash && table[a].device == table[b].device) {
        const int first = b == c->rank ? b : a, second = first == a ? b : a;
        close(own);
        return give_up(ncclInvalidUsage,
                       "Duplicate GPU detected : rank " + std::to_string(first) + " and rank " +
                           std::to_string(second) + " both on CUDA device " +
                           bus_id_text(table[a].device),
                       fds);
      }
  // The rest of the mesh: each rank connects to every lower rank but 0 and accepts the higher.
  for (int lower = 1; lower < c->rank; ++lower) {
    fds[lower] = emu::nccl::connect_loopback(table[lower].port, kInitSeconds, c->stopping, &error);
    const int32_t me = c->rank;
    if (fds[lower] < 0 || !emu::nccl::write_all(fds[lower], &me, sizeof me)) {
      close(own);
      return give_up(ncclSystemError,
                     "ncclCommInitRank: rank " + std::to_string(c->rank) + " cannot reach rank " +
                         std::to_string(lower) + ": " + error,
                     fds);
    }
  }
  for (int n = (c->rank == 0 ? c->nranks : c->rank + 1); n < c->nranks; ++n) {
    const int fd = emu::nccl::accept_within(own, kInitSeconds, c->stopping, &error);
    int32_t who = -1;
    if (fd < 0 || !emu::nccl::read_all(fd, &who, sizeof who, kInitSeconds, c->stopping) ||
        who <= c->rank || who >= c->nranks || fds[who] >= 0) {
      if (fd >= 0) close(fd);
      close(own);
      return give_up(ncclSystemError,
                     "ncclCommInitRank: rank " + std::to_string(c->rank) +
                         " did not hear from every higher rank: " + error,
                     fds);
    }
    fds[who] = fd;
  }
  close(own);
  c->links = std::make_unique<Links>(c->rank, std::move(fds));
  ncclResult_t expected = ncclInProgress;
  c->state.compare_exchange_strong(expected, ncclSuccess);
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, bool blocking) {
  if (out == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                    std::to_string(nranks) + " (expected 0 <= rank < nranks)");
  IdContents contents;
  std::memcpy(&contents, id.internal, sizeof contents);
  if (std::memcmp(contents.magic, kIdMagic, sizeof kIdMagic) != 0)
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRank: the unique id was not made by ncclGetUniqueId");
  auto* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = blocking;
  cudaGetDevice(&c->device);
  {
    std::lock_guard lock(g_mutex);
    g_live.insert(c);
  }
  *out = c;
  if (blocking) {
    initialise(c, contents);
    return c->state.load();
  }
  c->init = std::thread([c, contents] { initialise(c, contents); });
  return ncclInProgress;
}

// Operations ---------------------------------------------------------------------------------

enum class Kind { AllReduce, Reduce, ReduceScatter, AllGather, Broadcast, AlltoAll, Send, Recv };

struct Op {
  Kind kind;
  const char* name;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // elements per rank's chunk, as the call counts them
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int peer = 0;  // root, or the send/recv peer
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

size_t chunk_bytes(const Op& o) {
  return o.count * emu::nccl::type_bytes(o.type);
}

// Runs one collective on the host (inside the emulator's device section); false on failure,
// with the communicator's error set.
bool run_collective(const Op& o) {
  ncclComm_t c = o.comm;
  Links& links = *c->links;
  const int n = c->nranks, me = c->rank;
  const size_t bytes = chunk_bytes(o);
  std::string error;
  auto recv_from = [&](int peer, void* out, size_t size) {
    if (links.recv(peer, o.name, out, size, &error)) return true;
    fail_async(c, ncclRemoteError, std::string(o.name) + ": " + error);
    return false;
  };
  auto at = [](const void* base, size_t offset) {
    return static_cast<const char*>(base) + offset;
  };
  // Every rank's chunk (this rank's own is `mine`) combined in rank order 0, 1, ..., so each
  // rank gets the same bits; the result lands in o.recv.
  auto reduce_in_rank_order = [&](const std::vector<char>& mine) {
    std::vector<char> acc(bytes), other(bytes);
    for (int q = 0; q < n; ++q) {
      std::vector<char>& into = q == 0 ? acc : other;
      if (q == me)
        std::memcpy(into.data(), mine.data(), bytes);
      else if (!recv_from(q, into.data(), bytes))
        return false;
      if (q > 0) emu::nccl::reduce_into(acc.data(), other.data(), o.count, o.type, o.op);
    }
    if (o.op == ncclAvg) emu::nccl::finish_average(acc.data(), o.count, o.type, n);
    std::memcpy(o.recv, acc.data(), bytes);
    return true;
  };
  switch (o.kind) {
    case Kind::AllReduce:
    case Kind::Reduce: {
      const bool keeps = o.kind == Kind::AllReduce || me == o.peer;
      std::vector<char> mine(static_cast<const char*>(o.send),
                             static_cast<const char*>(o.send) + bytes);
      for (int p = 0; p < n; ++p)
        if (p != me && (o.kind == Kind::AllReduce || p == o.peer))
          links.send(p, o.name, mine.data(), bytes);
      return !keeps || reduce_in_rank_order(mine);
    }
    case Kind::ReduceScatter: {
      std::vector<char> mine(bytes);
      std::memcpy(mine.data(), at(o.send, static_cast<size_t>(me) * bytes), bytes);
      for (int p = 0; p < n; ++p)
        if (p != me) links.send(p, o.name, at(o.send, static_cast<size_t>(p) * bytes), bytes);
      return reduce_in_rank_order(mine);
    }
    case Kind::AllGather: {
      std::vector<char> all(bytes * static_cast<size_t>(n));
      std::memcpy(all.data() + static_cast<size_t>(me) * bytes, o.send, bytes);
      for (int p = 0; p < n; ++p)
        if (p != me) links.send(p, o.name, all.data() + static_cast<size_t>(me) * bytes, bytes);
      for (int q = 0; q < n; ++q)
        if (q != me && !recv_from(q, all.data() + static_cast<size_t>(q) * bytes, bytes))
          return false;
      std::memcpy(o.recv, all.data(), all.size());
      return true;
    }
    case Kind::Broadcast: {
      if (me == o.peer) {
        for (int p = 0; p < n; ++p)
          if (p != me) links.send(p, o.name, o.send, bytes);
        if (o.recv != o.send) std::memmove(o.recv, o.send, bytes);
        return true;
      }
      return recv_from(o.peer, o.recv, bytes);
    }
    case Kind::AlltoAll: {
      std::vector<char> all(bytes * static_cast<size_t>(n));
      std::memcpy(all.data() + static_cast<size_t>(me) * bytes,
                  at(o.send, static_cast<size_t>(me) * bytes), bytes);
      for (int p = 0; p < n; ++p)
        if (p != me) links.send(p, o.name, at(o.send, static_cast<size_t>(p) * bytes), bytes);
      for (int q = 0; q < n; ++q)
        if (q != me && !recv_from(q, all.data() + static_cast<size_t>(q) * bytes, bytes))
          return false;
      std::memcpy(o.recv, all.data(), all.size());
      return true;
    }
    case Kind::Send:
    case Kind::Recv:
      break;  // run_ops handles point-to-point
  }
  return true;
}

// Runs a group's operations (or one operation) as device work: sends of the group first, so no
// rank waits on a receive its peer's own pending receive blocks, then receives and collectives
// in call order.
void run_ops(const std::vector<std::shared_ptr<Op>>& all) {
  // A communicator aborted or destroyed while its operations waited on their stream: they do
  // nothing (ncclCommAbort stops what is queued as well as what is running).
  std::vector<std::shared_ptr<Op>> ops;
  {
    std::lock_guard lock(g_mutex);
    for (const auto& o : all)
      if (g_live.count(o->comm) != 0) ops.push_back(o);
  }
  std::vector<ncclComm_t> comms;
  for (const auto& o : ops)
    if (std::find(comms.begin(), comms.end(), o->comm) == comms.end()) comms.push_back(o->comm);
  for (ncclComm_t c : comms) c->busy.fetch_add(1);
  for (const auto& o : ops)
    if (o->kind == Kind::Send && o->comm->state.load() == ncclSuccess)
      o->comm->links->send(o->peer, "ncclSend/ncclRecv", o->send, chunk_bytes(*o));
  for (const auto& o : ops) {
    ncclComm_t c = o->comm;
    if (c->state.load() != ncclSuccess || c->stopping.load()) continue;
    if (o->kind == Kind::Send) continue;
    if (o->kind == Kind::Recv) {
      std::string error;
      if (!c->links->recv(o->peer, "ncclSend/ncclRecv", o->recv, chunk_bytes(*o), &error))
        fail_async(c, ncclRemoteError, std::string(o->name) + ": " + error);
      continue;
    }
    run_collective(*o);
  }
  for (ncclComm_t c : comms) {
    if (const std::string e = c->links->send_error(); !e.empty())
      fail_async(c, ncclRemoteError, e);
    c->busy.fetch_sub(1);
  }
}

// Queues `ops` on the first one's stream (or records them into its capture).
ncclResult_t issue(std::vector<std::shared_ptr<Op>> ops) {
  if (ops.empty()) return ncclSuccess;
  const cudaStream_t stream = ops.front()->stream;
  const char* what = ops.size() == 1 ? ops.front()->name : "ncclGroupEnd";
  const cudaError_t rc = emu::rt::enqueue_collective(stream, what, [ops] { run_ops(ops); });
  if (rc != cudaSuccess)
    return fail(ops.front()->comm, ncclUnhandledCudaError,
                std::string(what) + ": " + cudaGetErrorName(rc) + " on its stream");
  if (emu::rt::capturing(stream)) return ncclSuccess;
  for (const auto& o : ops)
    if (const ncclResult_t state = o->comm->state.load(); state != ncclSuccess) return state;
  return ncclSuccess;
}

bool device_buffer(const void* p, size_t bytes) {
  return bytes == 0 || (p != nullptr && emu::rt::device_range(p, bytes));
}

// Checks an operation's arguments, then runs it or adds it to this thread's group.
ncclResult_t submit(Op o, size_t send_bytes, size_t recv_bytes) {
  if (const ncclResult_t rc = check_comm(o.comm, o.name); rc != ncclSuccess) return rc;
  const ncclComm_t c = o.comm;
  const std::string call = o.name;
  if (emu::nccl::type_bytes(o.type) == 0)
    return fail(c, ncclInvalidArgument,
                call + ": datatype " + emu::nccl::type_name(o.type) + " is not supported here");
  const bool reduces = o.kind == Kind::AllReduce || o.kind == Kind::Reduce ||
                       o.kind == Kind::ReduceScatter;
  if (reduces && !emu::nccl::builtin_op(o.op))
    return fail(c, ncclInvalidArgument, call + ": op " + std::to_string(int(o.op)) +
                                            " is not a built-in reduction");
  const bool rooted = o.kind == Kind::Reduce || o.kind == Kind::Broadcast;
  const bool p2p = o.kind == Kind::Send || o.kind == Kind::Recv;
  if ((rooted || p2p) && (o.peer < 0 || o.peer >= c->nranks || (p2p && o.peer == c->rank)))
    return fail(c, ncclInvalidArgument,
                call + ": " + (p2p ? "peer " : "root ") + std::to_string(o.peer) +
                    " is not another rank of " + std::to_string(c->nranks));
  if (!device_buffer(o.send, send_bytes))
    return fail(c, ncclInvalidArgument,
                call + ": sendbuff (" + std::to_string(send_bytes) +
                    " bytes) is not device memory");
  if (!device_buffer(o.recv, recv_bytes))
    return fail(c, ncclInvalidArgument,
                call + ": recvbuff (" + std::to_string(recv_bytes) +
                    " bytes) is not device memory");
  auto op = std::make_shared<Op>(o);
  if (t_group_depth > 0) {
    t_group.push_back(std::move(op));
    return ncclSuccess;
  }
  return issue({std::move(op)});
}

Op make(Kind kind, const char* name, const void* send, void* recv, size_t count,
        ncclDataType_t type, ncclRedOp_t red, int peer, ncclComm_t comm, cudaStream_t stream) {
  Op o;
  o.kind = kind;
  o.name = name;
  o.send = send;
  o.recv = recv;
  o.count = count;
  o.type = type;
  o.op = red;
  o.peer = peer;
  o.comm = comm;
  o.stream = stream;
  return o;
}

int ranks_of(ncclComm_t comm) {
  std::lock_guard lock(g_mutex);
  return g_live.count(comm) != 0 ? comm->nranks : 1;
}

int rank_of(ncclComm_t comm) {
  std::lock_guard lock(g_mutex);
  return g_live.count(comm) != 0 ? comm->rank : 0;
}

size_t bytes_of(size_t count, ncclDataType_t type) {
  return count * emu::nccl::type_bytes(type);
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  static thread_local std::string copy;
  std::lock_guard lock(g_mutex);
  if (comm != nullptr && g_live.count(comm) != 0) {
    std::lock_guard comm_lock(comm->mutex);
    copy = comm->last_error;
  } else {
    copy = g_last_error;
  }
  return copy.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return fail(nullptr, ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
  IdContents contents{};
  std::memcpy(contents.magic, kIdMagic, sizeof kIdMagic);
  std::random_device random;
  contents.token = (static_cast<uint64_t>(random()) << 32) ^ random() ^
                   static_cast<uint64_t>(getpid());
  std::string error;
  const int listener = emu::nccl::listen_loopback(&contents.port, &error);
  if (listener < 0) return fail(nullptr, ncclSystemError, "ncclGetUniqueId: " + error);
  {
    std::lock_guard lock(g_mutex);
    g_listeners[contents.token] = listener;
  }
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, &contents, sizeof contents);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return init_rank(comm, nranks, id, rank, true);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (config != nullptr && config->magic != 0xcafebeef)
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRankConfig: config was not set from NCCL_CONFIG_INITIALIZER");
  const bool blocking =
      config == nullptr || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  return init_rank(comm, nranks, id, rank, blocking);
}

ncclResult_t ncclCommInitAll(ncclComm_t*, int, const int*) {
  return fail(nullptr, ncclInvalidUsage,
              "ncclCommInitAll: several devices in one process are not emulated");
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (async_error == nullptr)
    return fail(comm, ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  {
    std::lock_guard lock(g_mutex);
    if (comm == nullptr || g_live.count(comm) == 0)
      return fail(nullptr, ncclInvalidArgument,
                  "ncclCommGetAsyncError: comm is not a live communicator");
  }
  *async_error = comm->state.load();
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (count == nullptr) return ncclInvalidArgument;
  *count = ranks_of(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (rank == nullptr) return ncclInvalidArgument;
  *rank = rank_of(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (device == nullptr) return ncclInvalidArgument;
  std::lock_guard lock(g_mutex);
  if (g_live.count(comm) == 0) return ncclInvalidArgument;
  *device = comm->device;
  return ncclSuccess;
}

// Runs the operations still queued on streams, then flushes the sends still queued for peers.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  {
    std::lock_guard lock(g_mutex);
    if (g_live.count(comm) == 0)
      return fail(nullptr, ncclInvalidArgument, "ncclCommFinalize: comm is not a live communicator");
  }
  emu::rt::synchronize();
  if (comm->links && !comm->links->drain(kInitSeconds))
    return fail(comm, ncclSystemError, "ncclCommFinalize: messages to peers still unsent");
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  emu::rt::synchronize();  // queued operations on it complete first, as ncclCommFinalize's do
  {
    std::lock_guard lock(g_mutex);
    if (g_live.erase(comm) == 0)
      return fail(nullptr, ncclInvalidArgument, "ncclCommDestroy: comm is not a live communicator");
  }
  if (comm->init.joinable()) comm->init.join();
  // What this rank sent may still be queued: peers get it before the connections close.
  if (comm->links && !comm->links->drain(kInitSeconds))
    std::fprintf(stderr, "NCCL stand-in: rank %d: messages still unsent after %g s at "
                 "ncclCommDestroy\n", comm->rank, kInitSeconds);
  delete comm;
  return ncclSuccess;
}

// Stops whatever the communicator is doing: waiting receives fail, init gives up. Memory is
// freed once no operation is running on it (10 s at most; left allocated after that).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    std::lock_guard lock(g_mutex);
    if (g_live.count(comm) == 0) return ncclInvalidArgument;
  }
  comm->stopping.store(true);
  if (comm->init.joinable()) comm->init.join();
  if (comm->links) comm->links->shutdown();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (comm->busy.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {
    std::lock_guard lock(g_mutex);
    g_live.erase(comm);
  }
  if (comm->busy.load() == 0) delete comm;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  if (t_group_depth++ == 0) t_group.clear();
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0)
    return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<std::shared_ptr<Op>> ops;
  ops.swap(t_group);
  return issue(std::move(ops));
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t bytes = bytes_of(count, datatype);
  return submit(make(Kind::AllReduce, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0,
                     comm, stream),
                bytes, bytes);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  const size_t bytes = bytes_of(count, datatype);
  return submit(make(Kind::Reduce, "ncclReduce", sendbuff, recvbuff, count, datatype, op, root,
                     comm, stream),
                bytes, rank_of(comm) == root ? bytes : 0);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  const size_t bytes = bytes_of(recvcount, datatype);
  return submit(make(Kind::ReduceScatter, "ncclReduceScatter", sendbuff, recvbuff, recvcount,
                     datatype, op, 0, comm, stream),
                bytes * static_cast<size_t>(ranks_of(comm)), bytes);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = bytes_of(sendcount, datatype);
  return submit(make(Kind::AllGather, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype,
                     ncclSum, 0, comm, stream),
                bytes, bytes * static_cast<size_t>(ranks_of(comm)));
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t bytes = bytes_of(count, datatype);
  return submit(make(Kind::Broadcast, "ncclBroadcast", sendbuff, recvbuff, count, datatype,
                     ncclSum, root, comm, stream),
                rank_of(comm) == root ? bytes : 0, bytes);
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                       ncclComm_t comm, cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  const size_t bytes = bytes_of(count, datatype) * static_cast<size_t>(ranks_of(comm));
  return submit(make(Kind::AlltoAll, "ncclAlltoAll", sendbuff, recvbuff, count, datatype,
                     ncclSum, 0, comm, stream),
                bytes, bytes);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return submit(make(Kind::Send, "ncclSend", sendbuff, nullptr, count, datatype, ncclSum, peer,
                     comm, stream),
                bytes_of(count, datatype), 0);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return submit(make(Kind::Recv, "ncclRecv", nullptr, recvbuff, count, datatype, ncclSum, peer,
                     comm, stream),
                0, bytes_of(count, datatype));
}

}  // extern "C"
