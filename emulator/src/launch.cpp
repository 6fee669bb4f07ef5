// Launching a grid: checks the configuration as CUDA does (sm_90 limits, launch.h), then runs
// its blocks one after another on the calling host thread, in order or in a seeded random
// order. Poisoning fills every dynamic shared buffer whole before the first block (reads past
// the launch's size show too) and the launch's bytes again before each later block.
#include "emu/launch.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "block.h"
#include "describe.h"
#include "rng.h"

namespace emu {
namespace detail {
namespace {

constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};
constexpr unsigned long long kMaxGridDim[3] = {(1ull << 31) - 1, 65535, 65535};

thread_local size_t tls_dynamic_bytes = 0;

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void*, size_t> max_dynamic;  // opted-in limits, by kernel
  std::vector<void* (*)()> dynamic_buffers;
};
Registry& registry() {
  static Registry r;
  return r;
}

std::string symbol_name(const void* kernel) {
  Dl_info info;
  if (dladdr(kernel, &info) && info.dli_sname) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> demangled(
        abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status), std::free);
    return status == 0 ? demangled.get() : info.dli_sname;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", kernel);
  return std::string("at ") + buf;
}

std::string dims_text(dim3 d) {
  return thread_text(uint3{d.x, d.y, d.z});
}

Status check_config(const LaunchConfig& c, const void* kernel, const std::string& name) {
  const auto bad = [&](ErrorCode code, const std::string& what) {
    return Status{code, "kernel " + name + ": " + what};
  };
  const unsigned block[3] = {c.block.x, c.block.y, c.block.z};
  const unsigned grid[3] = {c.grid.x, c.grid.y, c.grid.z};
  for (int i = 0; i < 3; ++i) {
    if (block[i] == 0 || grid[i] == 0)
      return bad(ErrorCode::kInvalidConfiguration, "grid " + dims_text(c.grid) + " and block " +
                                                       dims_text(c.block) +
                                                       " must have no zero dimension");
    if (block[i] > kMaxBlockDim[i])
      return bad(ErrorCode::kInvalidConfiguration,
                 "block " + dims_text(c.block) + " is over sm_90's 1024 x 1024 x 64");
    if (grid[i] > kMaxGridDim[i])
      return bad(ErrorCode::kInvalidConfiguration,
                 "grid " + dims_text(c.grid) + " is over sm_90's 2^31-1 x 65535 x 65535");
  }
  const unsigned long long threads = 1ull * c.block.x * c.block.y * c.block.z;
  if (threads > kMaxThreadsPerBlock)
    return bad(ErrorCode::kInvalidConfiguration, "block " + dims_text(c.block) + " has " +
                                                     std::to_string(threads) +
                                                     " threads; at most 1024");
  size_t limit = kDefaultDynamicSharedBytes;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    if (auto it = r.max_dynamic.find(kernel); it != r.max_dynamic.end()) limit = it->second;
  }
  if (c.dynamic_shared_bytes > limit)
    return bad(ErrorCode::kInvalidValue,
               std::to_string(c.dynamic_shared_bytes) +
                   " bytes of dynamic shared memory; the "
                   "kernel's limit is " +
                   std::to_string(limit) +
                   (limit == kDefaultDynamicSharedBytes
                        ? " (48 KiB: more needs set_max_dynamic_shared_bytes, as "
                          "cudaFuncSetAttribute)"
                        : ""));
  return {};
}

}  // namespace

Status check_launch(const LaunchConfig& c, const void* kernel) {
  return check_config(c, kernel, c.kernel_name ? c.kernel_name : symbol_name(kernel));
}

bool register_dynamic_shared(void* (*buffer)()) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.dynamic_buffers.push_back(buffer);
  return true;
}

bool tls_anchor() {
  return true;
}

Status run_grid(const LaunchConfig& c, const void* kernel, KernelBody body) {
  const std::string name = c.kernel_name ? c.kernel_name : symbol_name(kernel);
  Block& block = this_thread_block();
  if (block.running())
    return Status{ErrorCode::kInvalidValue,
                  "kernel " + name +
                      " launched from inside a kernel (dynamic parallelism is "
                      "not emulated)"};
  if (Status s = check_config(c, kernel, name); !s.ok()) return s;
  const Options& options = c.options ? *c.options : default_options();
  std::vector<void* (*)()> buffers;
  if (options.poison_shared) {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    buffers = r.dynamic_buffers;
  }

  blockDim = c.block;
  gridDim = c.grid;
  tls_dynamic_bytes = c.dynamic_shared_bytes;
  const uint64_t gx = c.grid.x, gy = c.grid.y, blocks = gx * gy * c.grid.z;
  const Permutation order(blocks, options.seed);
  Status status;
  for (uint64_t i = 0; i < blocks && status.ok(); ++i) {
    const uint64_t b = options.random_schedule ? order.at(i) : i;
    blockIdx = uint3{static_cast<unsigned>(b % gx), static_cast<unsigned>(b / gx % gy),
                     static_cast<unsigned>(b / (gx * gy))};
    for (void* (*buffer)() : buffers)
      std::memset(buffer(), kPoisonByte, i == 0 ? kMaxDynamicSharedBytes : c.dynamic_shared_bytes);
    const BlockSetup setup{name.c_str(), body, c.block, &options, mix64(options.seed ^ mix64(b))};
    status = block.run(setup);
  }
  tls_dynamic_bytes = 0;
  blockIdx = uint3{};
  blockDim = gridDim = dim3{};
  return status;
}

}  // namespace detail

Status set_max_dynamic_shared_bytes(const void* kernel, size_t bytes) {
  if (bytes > kMaxDynamicSharedBytes)
    return Status{ErrorCode::kInvalidValue, std::to_string(bytes) +
                                                " bytes of dynamic shared memory requested; sm_90 "
                                                "allows at most " +
                                                std::to_string(kMaxDynamicSharedBytes) +
                                                " per block"};
  detail::Registry& r = detail::registry();
  std::lock_guard lock(r.mutex);
  r.max_dynamic[kernel] = bytes;
  return {};
}

size_t dynamic_shared_bytes() {
  return detail::tls_dynamic_bytes;
}

}  // namespace emu
