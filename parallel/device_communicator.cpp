// make_device_communicator: NCCL, or the factory a test installed (see device_communicator.h).
#include "parallel/device_communicator.h"

#include <stdexcept>
#include <string>
#include <utility>

#ifdef MOD_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace mod::parallel {

namespace {
DeviceCommunicatorFactory& test_factory() {
  static DeviceCommunicatorFactory factory;
  return factory;
}
}  // namespace

void set_device_communicator_factory_for_testing(DeviceCommunicatorFactory factory) {
  test_factory() = std::move(factory);
}

std::unique_ptr<Communicator> make_device_communicator(Communicator& world) {
  if (test_factory()) return test_factory()(world);
#ifdef MOD_HAVE_NCCL
  return make_nccl_communicator(world.split(0, world.rank(), "world"));
#else
  throw std::invalid_argument(
      "train.device CUDA with " + std::to_string(world.size()) +
      " processes needs NCCL, and this build has none (configure with -DMOD_USE_CUDA=ON)");
#endif
}

}  // namespace mod::parallel
