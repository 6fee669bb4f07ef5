// The communicator that CUDA tensors travel through when a job trains on GPUs: NCCL over the
// host world's ranks (bootstrapped over it), in builds with NCCL.
#pragma once

#include <functional>
#include <memory>

#include "parallel/communicator.h"

namespace mod::parallel {

// For a world of several processes training with train.device CUDA. Throws, naming the build
// option, when the build has no NCCL (MPI refuses device tensors).
std::unique_ptr<Communicator> make_device_communicator(Communicator& world);

// Tests without a GPU: make_device_communicator returns factory(world) instead (an empty function
// restores NCCL). The device-path tests pass device tensors through MPI via host copies so.
using DeviceCommunicatorFactory = std::function<std::unique_ptr<Communicator>(Communicator& world)>;
void set_device_communicator_factory_for_testing(DeviceCommunicatorFactory factory);

}  // namespace mod::parallel
