// What this process computes with: the CPU backend's GEMM kernel and threads, and the GPUs the
// build can see. Printed at start-up by every program so a slow kernel is never a surprise.
#pragma once

#include <string>

namespace mod {

std::string device_report();
int cuda_device_count();  // 0 in a build without CUDA

}  // namespace mod
