// Element-wise reductions in NCCL's types (see nccl_reduce.h).
#include "nccl_reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace emu::nccl {
namespace {

// bf16 <-> float: the top 16 bits of a float, rounded to nearest even; NaN stays a quiet NaN.
float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
T apply(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd:
      return static_cast<T>(a * b);
    case ncclMax:
      return std::max(a, b);
    case ncclMin:
      return std::min(a, b);
    default:  // ncclSum, ncclAvg (divided at the end)
      return static_cast<T>(a + b);
  }
}

template <typename T>
void reduce_typed(void* acc, const void* in, size_t count, ncclRedOp_t op) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  for (size_t i = 0; i < count; ++i) a[i] = apply(a[i], b[i], op);
}

// Half and bf16: each step in float, rounded back (widen/narrow are the type's conversions).
template <float (*widen)(uint16_t), uint16_t (*narrow)(float)>
void reduce_narrow(void* acc, const void* in, size_t count, ncclRedOp_t op) {
  uint16_t* a = static_cast<uint16_t*>(acc);
  const uint16_t* b = static_cast<const uint16_t*>(in);
  for (size_t i = 0; i < count; ++i) a[i] = narrow(apply(widen(a[i]), widen(b[i]), op));
}

float half_to_float(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, sizeof v);
  return static_cast<float>(v);
}
uint16_t float_to_half(float f) {
  const _Float16 v = static_cast<_Float16>(f);  // round to nearest even
  uint16_t h;
  std::memcpy(&h, &v, sizeof h);
  return h;
}

template <typename T>
void divide_typed(void* acc, size_t count, int ranks) {
  T* a = static_cast<T*>(acc);
  for (size_t i = 0; i < count; ++i) a[i] = static_cast<T>(a[i] / static_cast<T>(ranks));
}

template <float (*widen)(uint16_t), uint16_t (*narrow)(float)>
void divide_narrow(void* acc, size_t count, int ranks) {
  uint16_t* a = static_cast<uint16_t*>(acc);
  for (size_t i = 0; i < count; ++i) a[i] = narrow(widen(a[i]) / static_cast<float>(ranks));
}

}  // namespace

size_t type_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* type_name(ncclDataType_t type) {
  static const char* const names[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",    "ncclUint32",
                                      "ncclInt64",   "ncclUint64",  "ncclFloat16",  "ncclFloat32",
                                      "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                      "ncclFloat8e5m2"};
  const int i = static_cast<int>(type);
  return i >= 0 && i < ncclNumTypes ? names[i] : "an unknown ncclDataType_t";
}

bool builtin_op(ncclRedOp_t op) {
  return op == ncclSum || op == ncclProd || op == ncclMax || op == ncclMin || op == ncclAvg;
}

void reduce_into(void* acc, const void* in, size_t count, ncclDataType_t type, ncclRedOp_t op) {
  switch (type) {
    case ncclInt8:
      return reduce_typed<int8_t>(acc, in, count, op);
    case ncclUint8:
      return reduce_typed<uint8_t>(acc, in, count, op);
    case ncclInt32:
      return reduce_typed<int32_t>(acc, in, count, op);
    case ncclUint32:
      return reduce_typed<uint32_t>(acc, in, count, op);
    case ncclInt64:
      return reduce_typed<int64_t>(acc, in, count, op);
    case ncclUint64:
      return reduce_typed<uint64_t>(acc, in, count, op);
    case ncclFloat32:
      return reduce_typed<float>(acc, in, count, op);
    case ncclFloat64:
      return reduce_typed<double>(acc, in, count, op);
    case ncclFloat16:
      return reduce_narrow<half_to_float, float_to_half>(acc, in, count, op);
    case ncclBfloat16:
      return reduce_narrow<bf16_to_float, float_to_bf16>(acc, in, count, op);
    default:
      return;  // refused before any data moves (type_bytes is 0)
  }
}

void finish_average(void* acc, size_t count, ncclDataType_t type, int ranks) {
  switch (type) {
    case ncclInt8:
      return divide_typed<int8_t>(acc, count, ranks);
    case ncclUint8:
      return divide_typed<uint8_t>(acc, count, ranks);
    case ncclInt32:
      return divide_typed<int32_t>(acc, count, ranks);
    case ncclUint32:
      return divide_typed<uint32_t>(acc, count, ranks);
    case ncclInt64:
      return divide_typed<int64_t>(acc, count, ranks);
    case ncclUint64:
      return divide_typed<uint64_t>(acc, count, ranks);
    case ncclFloat32:
      return divide_typed<float>(acc, count, ranks);
    case ncclFloat64:
      return divide_typed<double>(acc, count, ranks);
    case ncclFloat16:
      return divide_narrow<half_to_float, float_to_half>(acc, count, ranks);
    case ncclBfloat16:
      return divide_narrow<bf16_to_float, float_to_bf16>(acc, count, ranks);
    default:
      return;
  }
}

}  // namespace emu::nccl
