// make_device_world: NCCL, or the factory a test installed (see device_world.h).
#include "parallel/device_world.h"

#include <stdexcept>
#include <string>
#include <utility>

#ifdef MOD_HAVE_NCCL
#include "parallel/nccl_communicator.h"
#endif

namespace mod::parallel {

namespace {
DeviceWorldFactory& test_factory() {
  static DeviceWorldFactory factory;
  return factory;
}
}  // namespace

void set_device_world_factory_for_testing(DeviceWorldFactory factory) {
  test_factory() = std::move(factory);
}

std::unique_ptr<Communicator> make_device_world(Communicator& world) {
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
