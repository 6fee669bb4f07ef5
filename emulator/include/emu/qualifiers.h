// CUDA's declaration qualifiers as g++ reads them: execution-space and launch attributes vanish,
// __shared__ becomes per-host-thread storage. Included after any toolkit header, whose
// host_defines.h defines them as attributes g++ warns about, so ours always win.
#pragma once

#undef __global__
#undef __device__
#undef __host__
#undef __constant__
#undef __managed__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#undef __grid_constant__

#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
// A block runs whole on one host thread, so a block-scope thread_local (static implied) is the
// block's own shared variable. `extern __shared__` needs MOD_EMU_DYNAMIC_SHARED (launch.h).
#define __shared__ thread_local
// __restrict__ is g++'s own keyword and needs no macro.
