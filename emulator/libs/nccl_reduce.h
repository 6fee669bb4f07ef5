// The NCCL stand-in's element types and reductions: a rank's buffer combined with a peer's, one
// element at a time, in NCCL's types and operators (nccl.h: ncclDataType_t, ncclRedOp_t).
// Floating-point narrow types (half, bf16) are widened to float for each operation and rounded
// back, to nearest even, after it: what NCCL's kernels do for one step of a reduction.
#pragma once

#include <nccl.h>

#include <cstddef>

namespace emu::nccl {

// Bytes of one element; 0 for a type the stand-in does not reduce (the fp8 types).
size_t type_bytes(ncclDataType_t type);
const char* type_name(ncclDataType_t type);

// Whether `op` is one of the built-in operators (sum, prod, max, min, avg).
bool builtin_op(ncclRedOp_t op);

// acc[i] = acc[i] (op) in[i] for `count` elements. ncclAvg sums here; finish_average divides.
void reduce_into(void* acc, const void* in, size_t count, ncclDataType_t type, ncclRedOp_t op);

// ncclAvg's last step: every element divided by `ranks` (integers: truncated, as NCCL does).
void finish_average(void* acc, size_t count, ncclDataType_t type, int ranks);

}  // namespace emu::nccl
