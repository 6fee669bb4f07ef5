// CPU rotary embedding. Angles are computed in double, one (cos, sin) table per token shared by
// all its heads, so positions in the millions stay accurate; the rotation itself runs in T.
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

namespace {
// Angles below this take the vectorised sincos (q * pi/2 head exact for q < 2^20).
constexpr double kMaxReducedAngle = 1.6e6;

// sin and cos of x in [0, kMaxReducedAngle) to 1 ulp, branch-free so GCC vectorises it (libm's
// calls do not vectorise): Cody-Waite reduction by pi/2 with a 33-bit head, fdlibm's kernels on
// [-pi/4, pi/4], and the quadrant applied with integer bit operations.
inline void sincos_reduced(double x, double& s_out, double& c_out) {
  const double t = x * 6.36619772367581382433e-01 + 0x1.8p52;  // round(x * 2/pi) in low bits
  const double q = t - 0x1.8p52;
  const uint64_t quad = std::bit_cast<uint64_t>(t);
  const double r = (x - q * 1.57079632673412561417e+00) - q * 6.07710050630396597660e-11 -
                   q * 2.02226624879595063154e-21;
  const double z = r * r;
  const double s =
      r + r * z *
              (-1.66666666666666324348e-01 +
               z * (8.33333333332248946124e-03 +
                    z * (-1.98412698298579493134e-04 +
                         z * (2.75573137070700676789e-06 + z * (-2.50507602534068634195e-08 +
                                                                z * 1.58969099521155010221e-10)))));
  const double c =
      1.0 - 0.5 * z +
      z * z *
          (4.16666666666666019037e-02 +
           z * (-1.38888888888741095749e-03 +
                z * (2.48015872894767294178e-05 +
                     z * (-2.75573143513906633035e-07 +
                          z * (2.08757232129817482790e-09 + z * -1.13596475577881948265e-11)))));
  const uint64_t swap = 0 - (quad & 1);  // odd quadrant: sin and cos trade places
  const uint64_t sb = std::bit_cast<uint64_t>(s), cb = std::bit_cast<uint64_t>(c);
  s_out = std::bit_cast<double>(((sb & ~swap) | (cb & swap)) ^ ((quad & 2) << 62));
  c_out = std::bit_cast<double>(((cb & ~swap) | (sb & swap)) ^ (((quad + 1) & 2) << 62));
}

// x,y [N,H,Dh] (N = B*T tokens), pos [N]; pairs (i, i + Dh/2) rotated by pos * inv_freq[i].
template <typename T, typename I>
void rope_rows(const T* x, const I* pos, int64_t n, int64_t heads, int64_t dh, double theta,
               bool inverse, T* y) {
  const int64_t half = dh / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
  const double sign = inverse ? -1.0 : 1.0;
  const double* f = inv_freq.data();
#pragma omp parallel if (n * heads * dh > kParallelElements)
  {
    std::vector<T> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
    T* c = cos_t.data();
    T* s = sin_t.data();
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const double p = static_cast<double>(pos[t]);
      if (p * f[0] < kMaxReducedAngle) {  // f[0] = 1 is the largest frequency
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          double si, ci;
          sincos_reduced(p * f[i], si, ci);
          c[i] = static_cast<T>(ci);
          s[i] = static_cast<T>(sign * si);
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          c[i] = static_cast<T>(std::cos(p * f[i]));
          s[i] = static_cast<T>(sign * std::sin(p * f[i]));
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        const T* xr = x + (t * heads + h) * dh;
        T* yr = y + (t * heads + h) * dh;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const T x1 = xr[i], x2 = xr[i + half];
          yr[i] = x1 * c[i] - x2 * s[i];
          yr[i + half] = x1 * s[i] + x2 * c[i];
        }
      }
    }
  }
}
}  // namespace

// x,y [B,T,H,Dh], pos [B,T]
void CpuBackend::rope(const Tensor& x, const Tensor& pos, double theta, bool inverse, Tensor& y) {
  dispatch_float(x.dtype(), "rope", [&](auto z) {
    using T = decltype(z);
    dispatch_index(pos.dtype(), "rope", [&](auto zi) {
      using I = decltype(zi);
      rope_rows(x.data<T>(), pos.data<I>(), x.size(0) * x.size(1), x.size(2), x.size(3), theta,
                inverse, y.data<T>());
    });
  });
}

}  // namespace mod::cpu
