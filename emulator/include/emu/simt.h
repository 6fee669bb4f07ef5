// The CPU SIMT emulator: everything a CUDA kernel compiled as C++ needs (types, qualifiers,
// built-in variables, barriers, warp intrinsics, atomics, math intrinsics) and emu::launch.
// Kernels include this first; it does not need the CUDA toolkit (cuda_types.h says where the
// toolkit's cuda_bf16.h is used).
#pragma once

#include "emu/atomics.h"
#include "emu/builtins.h"
#include "emu/cuda_types.h"
#include "emu/intrinsics.h"
#include "emu/launch.h"
#include "emu/options.h"
#include "emu/sync.h"
#include "emu/warp.h"
