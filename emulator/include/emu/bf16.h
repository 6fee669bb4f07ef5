// bf16 for builds without the toolkit's cuda_bf16.h: __nv_bfloat16 and __nv_bfloat162 with the
// conversions and arithmetic the kernels use, rounding as the toolkit's host code does (float to
// bf16 round-to-nearest-even, NaN to 0x7fff; arithmetic in float, rounded once).
#pragma once

#include <cstdint>
#include <cstring>

namespace emu::detail {
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned short f32_to_bf16_rn(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Double to bf16 in one rounding: to float rounding to odd (the sticky bit survives), then to
// bf16 to nearest even; float's 24 bits are more than bf16's 2 * 8 + 2, so this is exact RNE.
inline unsigned short f64_to_bf16_rn(double d) {
  float f = static_cast<float>(d);
  uint32_t u = f32_bits(f);
  const double back = f;
  if ((d > 0.0 && back > d) || (d < 0.0 && back < d)) --u;
  if (back != d && (u << 1) <= 0xff000000u) u |= 1u;
  return f32_to_bf16_rn(bits_f32(u));
}
}  // namespace emu::detail

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct alignas(2) __nv_bfloat16 {
 protected:
  unsigned short __x;

 public:
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(emu::detail::f32_to_bf16_rn(f)) {}
  __nv_bfloat16(double d) : __x(emu::detail::f64_to_bf16_rn(d)) {}
  __nv_bfloat16(int v) : __nv_bfloat16(static_cast<double>(v)) {}
  __nv_bfloat16(unsigned v) : __nv_bfloat16(static_cast<double>(v)) {}
  operator float() const { return emu::detail::bits_f32(uint32_t{__x} << 16); }
  operator __nv_bfloat16_raw() const { return {__x}; }
};

struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  constexpr __nv_bfloat162(const __nv_bfloat16& a, const __nv_bfloat16& b) : x(a), y(b) {}
};

inline __nv_bfloat16 __float2bfloat16(float f) {
  return __nv_bfloat16(f);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16(f);
}
inline __nv_bfloat16 __double2bfloat16(double d) {
  return __nv_bfloat16(d);
}
inline float __bfloat162float(__nv_bfloat16 h) {
  return static_cast<float>(h);
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) {
  return static_cast<__nv_bfloat16_raw>(h).x;
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  return __nv_bfloat16_raw{u};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {a, b};
}
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) {
  return {a, b};
}
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 p) {
  return p.x;
}
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 p) {
  return p.y;
}
inline float __low2float(__nv_bfloat162 p) {
  return p.x;
}
inline float __high2float(__nv_bfloat162 p) {
  return p.y;
}

#define MOD_EMU_BF16_OP(op, name)                                                       \
  inline __nv_bfloat16 name(__nv_bfloat16 a, __nv_bfloat16 b) {                         \
    return __nv_bfloat16(static_cast<float>(a) op static_cast<float>(b));               \
  }                                                                                     \
  inline __nv_bfloat16 operator op(const __nv_bfloat16& a, const __nv_bfloat16& b) {    \
    return name(a, b);                                                                  \
  }                                                                                     \
  inline __nv_bfloat16& operator op##=(__nv_bfloat16& a, const __nv_bfloat16& b) {      \
    return a = name(a, b);                                                              \
  }                                                                                     \
  inline __nv_bfloat162 operator op(const __nv_bfloat162& a, const __nv_bfloat162& b) { \
    return {name(a.x, b.x), name(a.y, b.y)};                                            \
  }
MOD_EMU_BF16_OP(+, __hadd)
MOD_EMU_BF16_OP(-, __hsub)
MOD_EMU_BF16_OP(*, __hmul)
MOD_EMU_BF16_OP(/, __hdiv)
#undef MOD_EMU_BF16_OP

inline __nv_bfloat16 operator-(const __nv_bfloat16& a) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(__bfloat16_as_ushort(a) ^ 0x8000u));
}
#define MOD_EMU_BF16_CMP(op)                                                \
  inline bool operator op(const __nv_bfloat16& a, const __nv_bfloat16& b) { \
    return static_cast<float>(a) op static_cast<float>(b);                  \
  }
MOD_EMU_BF16_CMP(==)
MOD_EMU_BF16_CMP(!=)
MOD_EMU_BF16_CMP(<)
MOD_EMU_BF16_CMP(>)
MOD_EMU_BF16_CMP(<=)
MOD_EMU_BF16_CMP(>=)
#undef MOD_EMU_BF16_CMP
