// CUDA device discovery (built only with MOD_USE_CUDA; see core/device_report.h for callers).
#pragma once

#include <string>

namespace mod::cuda {

int device_count();              // 0 when there is no driver or no GPU
std::string describe_devices();  // one line for the start-up report

}  // namespace mod::cuda
