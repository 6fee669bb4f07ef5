// The host communicator of a job whose ranks met without MPI (parallel/rendezvous.h): CPU
// tensors travel through rank 0 of the rendezvous, one all-gather per collective. It carries the
// control traffic of a train.device=CUDA job (NCCL's unique id, stop flags, metrics, checkpoint
// coordination), not CPU training: that needs MPI (world.h, require_mpi_world).
//
// Invariants: results are bitwise equal on every rank (every rank reduces the same gathered
// bytes in rank order); a collective that a rank never enters, or a rank that exits, ends every
// rank's collective with an error naming it (Rendezvous). send/recv are not offered: no
// training path sends CPU tensors point to point, and the star has no direct links.
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/rendezvous.h"

namespace mod::parallel {

std::unique_ptr<Communicator> make_rendezvous_communicator(std::unique_ptr<Rendezvous> rendezvous,
                                                           const std::string& name = "world");

}  // namespace mod::parallel
