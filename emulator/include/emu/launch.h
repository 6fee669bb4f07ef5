// emu::launch: runs a `void kernel(Args...)` over a grid with CUDA's semantics and returns the
// launch's Status (what k<<<grid, block, shared>>>(args) followed by a synchronize would report).
// Launch limits are sm_90's (CUDA C++ Programming Guide, "Compute Capabilities", technical
// specifications): 1024 threads per block, block dims 1024 x 1024 x 64, grid y and z 65535,
// 48 KiB of dynamic shared memory unless the kernel opted in, up to 227 KiB.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emu/builtins.h"
#include "emu/options.h"

namespace emu {

inline constexpr size_t kDefaultDynamicSharedBytes = 48 * 1024;
inline constexpr size_t kMaxDynamicSharedBytes = 227 * 1024;

struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t dynamic_shared_bytes = 0;
  const char* kernel_name = nullptr;  // for messages; else the symbol's, else its address
  const Options* options = nullptr;   // else default_options()
};

namespace detail {
struct KernelBody {
  void (*run)(const void* state);
  const void* state;
};
Status run_grid(const LaunchConfig& config, const void* kernel, KernelBody body);
// The configuration checks run_grid makes first, alone: a runtime that queues or captures a
// launch reports a bad configuration when the launch is issued, as CUDA's cudaGetLastError does.
Status check_launch(const LaunchConfig& config, const void* kernel);
// Records a buffer MOD_EMU_DYNAMIC_SHARED defined, so launches can poison it.
bool register_dynamic_shared(void* (*buffer)());
// Opaque, so the thread_local it initialises needs dynamic initialisation (see below).
bool tls_anchor();
}  // namespace detail

// Every thread calls kernel with its own copies of the arguments, converted once at launch to
// the parameter types as a CUDA launch does; a thread may change its copies freely.
template <typename... P, typename... A>
Status launch(const LaunchConfig& config, void (*kernel)(P...), A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "emu::launch: wrong number of kernel arguments");
  using Params = std::tuple<std::decay_t<P>...>;
  struct State {
    void (*kernel)(P...);
    Params params;
  };
  const State state{kernel, Params(std::forward<A>(args)...)};
  const auto run = [](const void* s) {
    const State& st = *static_cast<const State*>(s);
    std::apply(st.kernel, st.params);
  };
  return detail::run_grid(config, reinterpret_cast<const void*>(kernel), {run, &state});
}

template <typename... P, typename... A>
Status launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, void (*kernel)(P...),
              A&&... args) {
  return launch(LaunchConfig{grid, block, dynamic_shared_bytes}, kernel, std::forward<A>(args)...);
}

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes): raises the
// kernel's dynamic shared limit; over kMaxDynamicSharedBytes is kInvalidValue.
Status set_max_dynamic_shared_bytes(const void* kernel, size_t bytes);
template <typename... P>
Status set_max_dynamic_shared_bytes(void (*kernel)(P...), size_t bytes) {
  return set_max_dynamic_shared_bytes(reinterpret_cast<const void*>(kernel), bytes);
}

// The running block's dynamic shared memory size (PTX %dynamic_smem_size).
size_t dynamic_shared_bytes();

}  // namespace emu

// The launch a rewritten k<<<grid, block, shared>>>(args) becomes, naming the kernel.
#define MOD_EMU_LAUNCH(kernel, grid, block, shared, ...)           \
  ::emu::launch(::emu::LaunchConfig{grid, block, shared, #kernel}, \
                kernel __VA_OPT__(, ) __VA_ARGS__)

// Defines what `extern __shared__ type name[];` in a kernel refers to: a per-host-thread buffer
// of the largest dynamic size, at the namespace of the kernel (a block-scope extern names a
// variable of the enclosing namespace, which C++ requires defined, in the same file when that
// namespace is anonymous). Launches poison it under Options::poison_shared. GCC 12 calls
// __tls_init for a block-scope extern thread_local but defines it only in a file with a
// dynamically initialised thread_local: the anchor is one.
#define MOD_EMU_DYNAMIC_SHARED(type, name)                                    \
  thread_local type name[::emu::kMaxDynamicSharedBytes / sizeof(type)]        \
      __attribute__((aligned(16)));                                           \
  [[maybe_unused]] static const bool mod_emu_dynamic_shared_##name =          \
      ::emu::detail::register_dynamic_shared([]() -> void* { return name; }); \
  [[maybe_unused]] thread_local const bool mod_emu_tls_anchor_##name = ::emu::detail::tls_anchor();
