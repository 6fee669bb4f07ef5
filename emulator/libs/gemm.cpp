// The stand-ins' GEMM (gemm.h). Each batch packs op(A) (m x k) and op(B) (k x n) column-major in
// the compute type, so the inner loop, P[:, j] += A[:, kk] * B[kk, j], runs over contiguous
// memory and adds each element's terms in k order; then one pass applies alpha, beta and the
// epilogue and rounds once.
#include "gemm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "emu/cuda_types.h"

namespace emu::blas {

size_t type_bytes(Type t) {
  switch (t) {
    case Type::kF32:
      return 4;
    case Type::kF64:
      return 8;
    case Type::kBF16:
      return 2;
  }
  return 0;
}

namespace {

template <typename Acc>
Acc load(const void* p, Type t, int64_t i) {
  switch (t) {
    case Type::kF32:
      return static_cast<Acc>(static_cast<const float*>(p)[i]);
    case Type::kF64:
      return static_cast<Acc>(static_cast<const double*>(p)[i]);
    case Type::kBF16:
      return static_cast<Acc>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
  }
  return Acc(0);
}

// One rounding from f64: every f32 value is an f64, so a value computed in f32 is rounded once.
void store(const void* p, Type t, int64_t i, double v) {
  void* q = const_cast<void*>(p);
  switch (t) {
    case Type::kF32:
      static_cast<float*>(q)[i] = static_cast<float>(v);
      break;
    case Type::kF64:
      static_cast<double*>(q)[i] = v;
      break;
    case Type::kBF16:
      static_cast<__nv_bfloat16*>(q)[i] = __double2bfloat16(v);
      break;
  }
}

// op(X) of batch `batch` (rows x cols) into `out`, column-major with ld = rows.
template <typename Acc>
void pack(const Matrix& x, bool trans, int64_t rows, int64_t cols, int64_t batch, Acc* out) {
  const int64_t base = batch * x.stride;
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < rows; ++i)
      out[i + j * rows] = load<Acc>(x.ptr, x.type, base + (trans ? j + i * x.ld : i + j * x.ld));
}

template <typename Acc>
void run_in(const Gemm& g) {
  const int64_t m = g.m, n = g.n, k = g.k;
  std::vector<Acc> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
  std::vector<Acc> p(static_cast<size_t>(m * n));
  const Acc alpha = static_cast<Acc>(g.alpha), beta = static_cast<Acc>(g.beta);
  for (int64_t batch = 0; batch < g.batch; ++batch) {
    pack(g.a, g.trans_a, m, k, batch, a.data());
    pack(g.b, g.trans_b, k, n, batch, b.data());
    std::fill(p.begin(), p.end(), Acc(0));
    for (int64_t j = 0; j < n; ++j) {
      Acc* __restrict__ pj = p.data() + j * m;
      for (int64_t kk = 0; kk < k; ++kk) {
        const Acc bv = b[static_cast<size_t>(kk + j * k)];
        const Acc* __restrict__ ak = a.data() + kk * m;
        for (int64_t i = 0; i < m; ++i) pj[i] += ak[i] * bv;
      }
    }
    const int64_t c0 = batch * g.c.stride, d0 = batch * g.d.stride, x0 = batch * g.aux.stride;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        Acc v = alpha * p[static_cast<size_t>(i + j * m)];
        if (g.beta != 0) v += beta * load<Acc>(g.c.ptr, g.c.type, c0 + i + j * g.c.ld);
        const double x = static_cast<double>(v);
        switch (g.epilogue) {
          case Epilogue::kNone:
            store(g.d.ptr, g.d.type, d0 + i + j * g.d.ld, x);
            break;
          case Epilogue::kGeluAux:
            store(g.aux.ptr, g.aux.type, x0 + i + j * g.aux.ld, x);
            store(g.d.ptr, g.d.type, d0 + i + j * g.d.ld, gelu(x));
            break;
          case Epilogue::kDGelu: {
            const double pre = load<double>(g.aux.ptr, g.aux.type, x0 + i + j * g.aux.ld);
            store(g.d.ptr, g.d.type, d0 + i + j * g.d.ld, x * gelu_grad(pre));
            break;
          }
        }
      }
    }
  }
}

constexpr double kGeluC0 = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC1 = 0.044715;

}  // namespace

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(kGeluC0 * (x + kGeluC1 * x * x * x)));
}

// d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx, t = tanh(u), u = c0 (x + c1 x^3).
double gelu_grad(double x) {
  const double t = std::tanh(kGeluC0 * (x + kGeluC1 * x * x * x));
  const double du = kGeluC0 * (1.0 + 3.0 * kGeluC1 * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

void run(const Gemm& g) {
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return;
  const bool f64 = g.a.type == Type::kF64;
  if (f64)
    run_in<double>(g);
  else
    run_in<float>(g);
}

}  // namespace emu::blas
