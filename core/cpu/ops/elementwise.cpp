// CPU elementwise kernels: binary ops with trailing-dim broadcast, scale and axpy. Loops are
// written so the compiler vectorises the inner dimension; OpenMP splits the outer one.
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

namespace {
template <typename T, typename F>
void binary_loop(Broadcast bcast, int64_t outer, int64_t inner, const T* a, const T* b, T* out,
                 F f) {
  const int64_t n = outer * inner;
  switch (bcast) {
    case Broadcast::Same:
#pragma omp parallel for simd if (n > kParallelElements)
      for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
      return;
    case Broadcast::Inner:
#pragma omp parallel for if (n > kParallelElements)
      for (int64_t o = 0; o < outer; ++o) {
        const T* ar = a + o * inner;
        T* orow = out + o * inner;
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) orow[i] = f(ar[i], b[i]);
      }
      return;
    case Broadcast::Outer:
#pragma omp parallel for if (n > kParallelElements)
      for (int64_t o = 0; o < outer; ++o) {
        const T* ar = a + o * inner;
        T* orow = out + o * inner;
        const T bo = b[o];
#pragma omp simd
        for (int64_t i = 0; i < inner; ++i) orow[i] = f(ar[i], bo);
      }
      return;
  }
}
}  // namespace

void CpuBackend::binary(BinaryKind kind, Broadcast bcast, int64_t outer, int64_t inner,
                        const Tensor& a, const Tensor& b, Tensor& out) {
  // By kind and broadcast, so an op profile tells a residual add from a gate or a clip.
  static const char* names[3][3] = {
      {"binary add", "binary add, b per column", "binary add, b per row"},
      {"binary sub", "binary sub, b per column", "binary sub, b per row"},
      {"binary mul", "binary mul, b per column", "binary mul, b per row"}};
  dispatch_float(out.dtype(), names[static_cast<int>(kind)][static_cast<int>(bcast)], [&](auto z) {
    using T = decltype(z);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    switch (kind) {
      case BinaryKind::Add:
        binary_loop(bcast, outer, inner, pa, pb, po, [](T x, T y) { return x + y; });
        break;
      case BinaryKind::Sub:
        binary_loop(bcast, outer, inner, pa, pb, po, [](T x, T y) { return x - y; });
        break;
      case BinaryKind::Mul:
        binary_loop(bcast, outer, inner, pa, pb, po, [](T x, T y) { return x * y; });
        break;
    }
  });
}

void CpuBackend::scale(const Tensor& x, double alpha, Tensor& out) {
  dispatch_float(out.dtype(), "scale", [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    const T s = static_cast<T>(alpha);
    const int64_t n = x.numel();
#pragma omp parallel for simd if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) po[i] = s * px[i];
  });
}

void CpuBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  dispatch_float(y.dtype(), "axpy", [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const T s = static_cast<T>(alpha);
    const int64_t n = y.numel();
#pragma omp parallel for simd if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) py[i] += s * px[i];
  });
}

}  // namespace mod::cpu
