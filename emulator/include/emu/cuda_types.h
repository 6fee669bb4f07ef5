// The CUDA types kernels name (dim3, uint3, uint4, float2, __nv_bfloat16, __nv_bfloat162):
// the toolkit's own where CMake found cuda_bf16.h (MOD_EMU_HAVE_CUDA_BF16; it brings
// vector_types.h with it), else the emulator's (vector_types.h, bf16.h). Either way the
// qualifier macros are the emulator's, defined last.
#pragma once

#if defined(MOD_EMU_HAVE_CUDA_BF16)
#include <cuda_bf16.h>
#else
#include "emu/bf16.h"
#include "emu/vector_types.h"
#endif

#include "emu/qualifiers.h"
