// What a CUDA source compiled under the emulator sees first (cu_to_cpp.py puts it at the top
// of every rewritten file): the SIMT core, the toolkit's runtime declarations, the launch that
// replaces <<<>>>, and the device-side runtime calls nvcc alone declares.
#pragma once

#include <cuda_runtime.h>

#include "emu/kernel_launch.h"
#include "emu/simt.h"

// cuda_device_runtime_api.h declares it for nvcc only.
void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);
