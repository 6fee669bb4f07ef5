// How the ranks of a job meet without MPI: rank 0 listens on TCP, every other rank connects to
// it, and rank 0 checks every rank's hello (rank, world size, job token, host) before the job
// goes on. After that the ranks can all-gather small blobs through rank 0 (a star), which is
// enough to hand out NCCL's unique id, to run a job's control traffic and to split sub-groups.
//
// Two ways to find rank 0 (docs/parallel.md, "Starting without MPI"):
// - tcp: rank 0 listens on MASTER_ADDR:MASTER_PORT;
// - file: rank 0 listens on a port the kernel picks and publishes "token nonce host port" in a
//   directory on shared storage (temp file + rename); the others poll for the file with this
//   job's token and retry when what they read was stale (a refused connection, or a nonce rank
//   0 no longer answers to), so a file left behind by an earlier job is never taken for this one.
//
// Invariants:
// - Nothing waits forever: meeting is bounded by RendezvousOptions::timeout_s and every
//   collective by op_timeout_s; past them the error names the ranks or the address missing.
// - No stranger on the port can end, delay or exhaust a meeting. Rank 0 serves every connection
//   at once; before its hello a connection gets a few KiB and 2 s. A hello that does not fit
//   (another job's token, another world size, a rank outside the world or taken) is refused to
//   its sender at once and logged, and rank 0 waits on; if the meeting then times out, its
//   error on every rank that reached rank 0 names the refusals (docs/parallel.md, "The
//   rendezvous's limits"). After the meeting, an error or an abort on any rank reaches every
//   rank at its next collective (rank 0 forwards it).
// - all_gather returns the same bytes on every rank, in rank order.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/tcp_socket.h"

namespace mod::parallel {

struct RendezvousOptions {
  int rank = 0, size = 1;
  std::string master_addr;  // rank 0's host name or address, e.g. "node01" or "127.0.0.1"
  int master_port = 0;      // tcp: where rank 0 listens, e.g. 29500
  std::string file_dir;     // non-empty: the file method, e.g. "/shared/rdzv"
  std::string token;        // the job's identity, e.g. "slurm-4711.0.0"; "" matches only ""
  std::string host;         // this process's host name, for messages
  double timeout_s = 300;   // to meet
  double op_timeout_s = 600;  // each collective after the meeting
  std::string found_by;     // what named rank 0, e.g. "MASTER_ADDR=node01 MASTER_PORT=29500"
};

class Rendezvous {
 public:
  // Meets the other ranks (collective over the job); throws with a message naming what failed.
  static std::unique_ptr<Rendezvous> meet(const RendezvousOptions& options);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  // Every rank's host name, in rank order (from the hellos).
  const std::vector<std::string>& hosts() const { return hosts_; }

  // Every rank's blob, in rank order, on every rank. `what` names the collective in errors.
  std::vector<std::string> all_gather(const std::string& blob, const char* what = "all_gather");
  // Rank `root`'s blob on every rank (the others' arguments are ignored).
  std::string broadcast(const std::string& blob, int root);
  void barrier() { all_gather({}, "barrier"); }
  // The ranks passing the same color, ordered by (key, rank), as a rendezvous of their own:
  // its first rank listens on this rank's address, the others connect. Collective here.
  std::unique_ptr<Rendezvous> split(int color, int key);
  // Best effort, never throws: tells every rank (through rank 0) that the job ends, and why.
  void abort(const std::string& message) noexcept;

 private:
  struct Peer;
  explicit Rendezvous(RendezvousOptions options);
  // Rank 0: accepts size - 1 valid hellos on `listener`, all connections at once; answers
  // every peer, and refuses or drops (logging it) every connection that is not one.
  void serve(tcp::Socket listener, const std::string& nonce);
  // Other ranks: connects to rank 0 (re-reading the published file when there is one).
  void join();
  void fail_everyone(const std::string& message);  // rank 0: an Abort to every peer, then throw

  RendezvousOptions options_;
  std::vector<Peer> peers_;  // rank 0: one per other rank, by rank; others: rank 0 only
  std::vector<std::string> hosts_;
  std::string address_;  // this rank's IPv4 address, as the others reach it
  uint64_t seq_ = 0;     // collectives so far: a rank that calls another one is caught
  int splits_ = 0;
};

}  // namespace mod::parallel
