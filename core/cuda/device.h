// CUDA device discovery (built only with MOD_USE_CUDA; see core/device_report.h for callers).
#pragma once

#include <cstdint>
#include <string>

namespace mod::cuda {

int device_count();              // 0 when there is no driver or no GPU
std::string describe_devices();  // one line for the start-up report
// The current device's dense peak in FLOP/s for MFU: tensor-core bf16 (bf16 true) or plain f32
// FMA, from its SM count and clock and the FLOPs per SM per clock of its architecture (Hopper
// 4096 bf16 / 256 f32, Ampere A100 2048 / 128, other sm_8x 1024 / 256). 0 without a device.
double peak_flops(bool bf16);
// GEMMs cuBLASLt ran with a GELU epilogue so far in this process (gemm_gelu, gemm_dgelu): a test
// tells the epilogue from the GEMM-then-GELU fallback by it.
int64_t epilogue_gemm_calls();

}  // namespace mod::cuda
