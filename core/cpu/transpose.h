// f32 matrix transposes for the CPU kernels: one 8x8 block in AVX registers, and whole matrices
// in such blocks (attention's tiles, a GEMM operand laid out for a faster product).
#pragma once

#include <cstdint>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace mod::cpu {

#if defined(__AVX__)
// The 8 rows of src [8, lds]^T, one 8x8 block in registers.
inline void transpose_8x8_rows(const float* src, int64_t lds, __m256 out[8]) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    out[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    out[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
}

// dst [8, ldd] = src [8, lds]^T.
inline void transpose_8x8(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 rows[8];
  transpose_8x8_rows(src, lds, rows);
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ldd, rows[i]);
}
#endif

// dst [cols, ldd] = src [rows, lds]^T, split over the OpenMP threads when parallel (by
// 8-column strips of src, so each thread writes whole rows of dst).
void transpose_matrix(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                      int64_t ldd, bool parallel);

// dst [cols, ldd] = src [rows, lds]^T + beta * dst (beta 0 ignores what dst held), split as
// transpose_matrix.
void transpose_matrix_add(const float* src, int64_t lds, int64_t rows, int64_t cols, float beta,
                          float* dst, int64_t ldd, bool parallel);

}  // namespace mod::cpu
