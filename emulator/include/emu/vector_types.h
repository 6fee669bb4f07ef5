// CUDA's vector and dimension types (uint3, dim3, float2, uint4...) for builds without the
// toolkit's vector_types.h: same names, members, alignments and make_* functions, so kernels
// that reinterpret memory as uint4 or float2 see the layout they see on a GPU.
#pragma once

#define MOD_EMU_VECTOR_TYPES(T, name, a2, a4)                   \
  struct name##1 {                                              \
    T x;                                                        \
  };                                                            \
  struct __attribute__((aligned(a2))) name##2 {                 \
    T x, y;                                                     \
  };                                                            \
  struct name##3 {                                              \
    T x, y, z;                                                  \
  };                                                            \
  struct __attribute__((aligned(a4))) name##4 {                 \
    T x, y, z, w;                                               \
  };                                                            \
  inline constexpr name##1 make_##name##1(T x) {                \
    return {x};                                                 \
  }                                                             \
  inline constexpr name##2 make_##name##2(T x, T y) {           \
    return {x, y};                                              \
  }                                                             \
  inline constexpr name##3 make_##name##3(T x, T y, T z) {      \
    return {x, y, z};                                           \
  }                                                             \
  inline constexpr name##4 make_##name##4(T x, T y, T z, T w) { \
    return {x, y, z, w};                                        \
  }

MOD_EMU_VECTOR_TYPES(signed char, char, 2, 4)
MOD_EMU_VECTOR_TYPES(unsigned char, uchar, 2, 4)
MOD_EMU_VECTOR_TYPES(short, short, 4, 8)
MOD_EMU_VECTOR_TYPES(unsigned short, ushort, 4, 8)
MOD_EMU_VECTOR_TYPES(int, int, 8, 16)
MOD_EMU_VECTOR_TYPES(unsigned int, uint, 8, 16)
MOD_EMU_VECTOR_TYPES(long long, longlong, 16, 16)
MOD_EMU_VECTOR_TYPES(unsigned long long, ulonglong, 16, 16)
MOD_EMU_VECTOR_TYPES(float, float, 8, 16)
MOD_EMU_VECTOR_TYPES(double, double, 16, 16)
#undef MOD_EMU_VECTOR_TYPES

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
