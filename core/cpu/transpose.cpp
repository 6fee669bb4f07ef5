#include "core/cpu/transpose.h"

#include <algorithm>

namespace mod::cpu {

void transpose_matrix(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                      int64_t ldd, bool parallel) {
  transpose_matrix_add(src, lds, rows, cols, 0.0f, dst, ldd, parallel);
}

void transpose_matrix_add(const float* src, int64_t lds, int64_t rows, int64_t cols, float beta,
                          float* dst, int64_t ldd, bool parallel) {
  const int64_t strips = (cols + 7) / 8;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t s = 0; s < strips; ++s) {
    const int64_t j0 = s * 8, jn = std::min<int64_t>(8, cols - j0);
    int64_t i0 = 0;
#if defined(__AVX__)
    if (jn == 8) {
      const __m256 vbeta = _mm256_set1_ps(beta);
      for (; i0 + 8 <= rows; i0 += 8) {
        __m256 t[8];
        transpose_8x8_rows(src + i0 * lds + j0, lds, t);
        float* d = dst + j0 * ldd + i0;
        for (int r = 0; r < 8; ++r) {
          const __m256 v =
              beta == 0.0f ? t[r]
                           : _mm256_add_ps(_mm256_mul_ps(vbeta, _mm256_loadu_ps(d + r * ldd)), t[r]);
          _mm256_storeu_ps(d + r * ldd, v);
        }
      }
    }
#endif
    for (int64_t j = j0; j < j0 + jn; ++j)
      for (int64_t i = i0; i < rows; ++i)
        dst[j * ldd + i] = beta == 0.0f ? src[i * lds + j] : beta * dst[j * ldd + i] + src[i * lds + j];
  }
}

}  // namespace mod::cpu
