#include "core/cpu/transpose.h"

#include <algorithm>

namespace mod::cpu {

void transpose_matrix(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                      int64_t ldd, bool parallel) {
  const int64_t strips = (cols + 7) / 8;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t s = 0; s < strips; ++s) {
    const int64_t j0 = s * 8, jn = std::min<int64_t>(8, cols - j0);
    int64_t i0 = 0;
#if defined(__AVX__)
    if (jn == 8)
      for (; i0 + 8 <= rows; i0 += 8)
        transpose_8x8(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
#endif
    for (int64_t j = j0; j < j0 + jn; ++j)
      for (int64_t i = i0; i < rows; ++i) dst[j * ldd + i] = src[i * lds + j];
  }
}

}  // namespace mod::cpu
