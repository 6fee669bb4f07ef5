// What a `kernel<<<grid, block, shared, stream>>>(args)` launch in a CUDA source becomes under
// the emulator (emulator/tools/cu_to_cpp.py rewrites it): the configuration is checked when
// the launch is issued, as cudaGetLastError reports it; the grid runs in the stream's order, or
// is recorded into the graph the stream is captured into, with the arguments as they were at
// the launch. A fault while it runs (a trap, a misused barrier) is the process's sticky error.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emu/launch.h"
#include "emu/runtime.h"

namespace emu::rt {

struct LaunchArgs {
  dim3 grid;
  dim3 block;
  size_t shared = 0;
  cudaStream_t stream = nullptr;
};

inline LaunchArgs launch_args(dim3 grid, dim3 block, size_t shared = 0,
                              cudaStream_t stream = nullptr) {
  return {grid, block, shared, stream};
}

// Records a bad launch configuration as the last error (not sticky, as in CUDA).
void launch_refused(const Status& status);
// A grid's fault, made the sticky error.
void launch_failed(const Status& status);

// `call(p...)` calls the kernel as the source's launch did, so template arguments the source
// left to deduction are deduced from the arguments here too; each thread calls it with its own
// copies. `resolve<A...>()` is the kernel's address when a `void (*)(A...)` names it exactly,
// else nullptr: what cudaFuncSetAttribute's opt-ins and messages are keyed by.
template <typename Call, typename Resolve, typename... A>
void launch_kernel(const LaunchArgs& a, const char* name, Call call, Resolve resolve, A&&... args) {
  const void* address = resolve.template operator()<std::decay_t<A>...>();
  const LaunchConfig config{a.grid, a.block, a.shared, name};
  if (Status s = detail::check_launch(config, address); !s.ok()) return launch_refused(s);
  using Params = std::tuple<std::decay_t<A>...>;
  auto params = std::make_shared<const Params>(std::forward<A>(args)...);
  enqueue(a.stream, name, [config, address, call, params] {
    struct State {
      const Call* call;
      const Params* params;
    };
    const State state{&call, params.get()};
    const auto run = [](const void* s) {
      const State& st = *static_cast<const State*>(s);
      std::apply(*st.call, *st.params);
    };
    const Status s = detail::run_grid(config, address, {run, &state});
    if (!s.ok()) launch_failed(s);
  });
}

}  // namespace emu::rt
