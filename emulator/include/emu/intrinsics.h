// Device intrinsics that are plain functions on the CPU: bit counting, reinterpretation, the
// fast-math forms and CUDA's min/max overloads. The fast-math forms (__expf...) return the
// accurate libm result, which lies inside the Guide's error bound for them but not bit-equal
// to a GPU's; kernels that must match bitwise avoid them already (kernel_utils.cuh says so).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace emu::detail {
template <typename To, typename From>
inline To bits_as(From v) {
  static_assert(sizeof(To) == sizeof(From));
  To r;
  std::memcpy(&r, &v, sizeof(To));
  return r;
}
}  // namespace emu::detail

inline int __popc(unsigned int x) {
  return __builtin_popcount(x);
}
inline int __popcll(unsigned long long x) {
  return __builtin_popcountll(x);
}
inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x));
}
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline int __ffs(int x) {
  return __builtin_ffs(x);
}
inline int __ffsll(long long x) {
  return __builtin_ffsll(x);
}
inline unsigned int __brev(unsigned int x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}

inline unsigned int __float_as_uint(float x) {
  return emu::detail::bits_as<unsigned int>(x);
}
inline float __uint_as_float(unsigned int x) {
  return emu::detail::bits_as<float>(x);
}
inline int __float_as_int(float x) {
  return emu::detail::bits_as<int>(x);
}
inline float __int_as_float(int x) {
  return emu::detail::bits_as<float>(x);
}
inline long long __double_as_longlong(double x) {
  return emu::detail::bits_as<long long>(x);
}
inline double __longlong_as_double(long long x) {
  return emu::detail::bits_as<double>(x);
}

inline float __expf(float x) {
  return std::exp(x);
}
inline float __exp10f(float x) {
  return std::pow(10.0f, x);
}
inline float __logf(float x) {
  return std::log(x);
}
inline float __log2f(float x) {
  return std::log2(x);
}
inline float __sinf(float x) {
  return std::sin(x);
}
inline float __cosf(float x) {
  return std::cos(x);
}
inline float __tanf(float x) {
  return std::tan(x);
}
inline float __powf(float x, float y) {
  return std::pow(x, y);
}
inline float __fdividef(float x, float y) {
  return x / y;
}
inline float __saturatef(float x) {
  return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : (x == x ? x : 0.0f));
}
inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
inline double rsqrt(double x) {
  return 1.0 / std::sqrt(x);
}
inline float __frsqrt_rn(float x) {
  return 1.0f / std::sqrt(x);
}
inline float __fsqrt_rn(float x) {
  return std::sqrt(x);
}
inline float __frcp_rn(float x) {
  return 1.0f / x;
}
inline float __fadd_rn(float x, float y) {
  return x + y;
}
inline float __fmul_rn(float x, float y) {
  return x * y;
}
inline float __fmaf_rn(float x, float y, float z) {
  return std::fma(x, y, z);
}
inline double __fma_rn(double x, double y, double z) {
  return std::fma(x, y, z);
}
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

// CUDA declares min and max at global scope for device code, which calls them unqualified.
#define MOD_EMU_MINMAX(T)  \
  inline T min(T a, T b) { \
    return b < a ? b : a;  \
  }                        \
  inline T max(T a, T b) { \
    return a < b ? b : a;  \
  }
MOD_EMU_MINMAX(int)
MOD_EMU_MINMAX(unsigned int)
MOD_EMU_MINMAX(long)
MOD_EMU_MINMAX(unsigned long)
MOD_EMU_MINMAX(long long)
MOD_EMU_MINMAX(unsigned long long)
#undef MOD_EMU_MINMAX
// fmaxf/fminf semantics for floating point, as CUDA's max(float, float): NaN loses.
inline float min(float a, float b) {
  return std::fmin(a, b);
}
inline float max(float a, float b) {
  return std::fmax(a, b);
}
inline double min(double a, double b) {
  return std::fmin(a, b);
}
inline double max(double a, double b) {
  return std::fmax(a, b);
}
