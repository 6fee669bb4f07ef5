// Who is on the other end: every rank's host and a watch socket to every peer, so a rank stuck
// in a collective can say which peer died. Open MPI 4.1 cannot: its TCP transport sees the
// peer hang up, prints a notice without the rank, and leaves the request pending until the
// launcher kills the job (docs/parallel.md, "Multi-host").
//
// Invariants:
// - A watch socket only ever reports a peer whose process has closed it (exit, kill -9): the
//   kernel sends FIN/RST then. A dead link or a stuck peer is silent here; the collective
//   timeout covers those. So a report never names a live peer.
// - Built only with MOD_USE_MPI=ON; start_peer_watch is collective over the world.
// - A background thread names a lost peer on stderr the moment its socket closes, whatever the
//   rank is doing; a rank waiting in a collective also aborts naming it and the collective.
#pragma once

#include <string>
#include <vector>

namespace mod::parallel {

class MpiCommunicator;

// Exchanges host labels ("node7" or, under mpirun, "node7/10.0.0.7": the address of the rank's
// Open MPI daemon) and connects one watch socket to each peer. Call once, on the world
// communicator, right after MPI starts. Watching is skipped above kMaxWatchedWorld ranks (one
// socket per peer); host labels are always exchanged.
void start_peer_watch(MpiCommunicator& world);
inline constexpr int kMaxWatchedWorld = 256;

// Peers that exit from now on are leaving, not lost: call before MPI_Finalize.
void stop_peer_watch();

// The host label of a world rank ("?" before start_peer_watch or for an unknown rank).
std::string peer_host(int world_rank);
// The first of `world_ranks` whose watch socket says its process is gone, or -1. Does not block.
int find_lost_peer(const std::vector<int>& world_ranks);

}  // namespace mod::parallel
