// The built-in variables a kernel reads: threadIdx, blockIdx, blockDim, gridDim and warpSize.
// They are per-host-thread variables the scheduler rewrites on every switch to a fiber, so the
// running CUDA thread always sees its own indices.
#pragma once

#include "emu/cuda_types.h"

extern thread_local constinit uint3 threadIdx;
extern thread_local constinit uint3 blockIdx;
extern thread_local constinit dim3 blockDim;
extern thread_local constinit dim3 gridDim;
inline constexpr int warpSize = 32;
