// CPU softmax over rows [N,V], logsumexp and the fused softmax + cross-entropy. Logsumexp and
// cross-entropy's forward read each row once (online max/sum, rescaled per L1-sized chunk);
// cross-entropy never stores probabilities: it caches lse [N] and its backward recomputes
// softmax from it; cross_entropy_with_dlogits does both on a row and writes dlogits in place.
// Every kernel computes one exp per element per pass over a row; sums accumulate in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/vec_math.h"

namespace mod::cpu {

namespace {

constexpr int64_t kChunk = 2048;  // elements re-read from L1 after their max is known

template <typename T>
T row_max(const T* x, int64_t len) {
  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < len; ++i) m = m > x[i] ? m : x[i];  // maxps form; std::max is not
  return m;
}

template <typename T>
struct RowStats {
  T max;
  double sum;  // sum of exp(x - max)
};

// Max and sum of exp(x - max) over row [V] in one pass over memory, one exp per element: each
// chunk's max is found first (an L1 re-read), and the running sum is rescaled when it grows.
template <typename T>
RowStats<T> row_stats(const T* row, int64_t v) {
  T m = -std::numeric_limits<T>::infinity();
  double s = 0.0;
  for (int64_t c0 = 0; c0 < v; c0 += kChunk) {
    const T* x = row + c0;
    const int64_t len = std::min(kChunk, v - c0);
    const T cm = row_max(x, len);
    if (cm > m) {
      s *= std::exp(static_cast<double>(m) - static_cast<double>(cm));
      m = cm;
    }
    double cs = 0.0;
#pragma omp simd reduction(+ : cs)
    for (int64_t i = 0; i < len; ++i) cs += static_cast<double>(exp_vec(x[i] - m));
    s += cs;
  }
  return {m, s};
}

}  // namespace

// x, y [N,V].
void CpuBackend::softmax_forward(const Tensor& x, Tensor& y) {
  dispatch_float(x.dtype(), "softmax_forward", [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), v = x.size(1);
    const T* px = x.data<T>();
    T* py = y.data<T>();
#pragma omp parallel for schedule(static) if (n * v > kParallelElements)
    for (int64_t row = 0; row < n; ++row) {
      const T* xr = px + row * v;
      T* yr = py + row * v;
      // Max, then exponentials stored with their sum, then the scale: one exp per element,
      // and the second and third passes re-read a row that is still in cache.
      const T m = row_max(xr, v);
      double s = 0.0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < v; ++i) {
        const T e = exp_vec(xr[i] - m);
        yr[i] = e;
        s += static_cast<double>(e);
      }
      const T inv = static_cast<T>(1.0 / s);
#pragma omp simd
      for (int64_t i = 0; i < v; ++i) yr[i] *= inv;
    }
  });
}

// y (the forward's output), dy, dx [N,V]: dx = y (dy - sum(y dy)) per row.
void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  dispatch_float(y.dtype(), "softmax_backward", [&](auto z) {
    using T = decltype(z);
    const int64_t n = y.size(0), v = y.size(1);
    const T* py = y.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
#pragma omp parallel for schedule(static) if (n * v > kParallelElements)
    for (int64_t row = 0; row < n; ++row) {
      const T* yr = py + row * v;
      const T* dyr = pdy + row * v;
      T* dxr = pdx + row * v;
      double dot = 0.0;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < v; ++i) dot += static_cast<double>(yr[i] * dyr[i]);
      const T c = static_cast<T>(dot);
#pragma omp simd
      for (int64_t i = 0; i < v; ++i) dxr[i] = yr[i] * (dyr[i] - c);
    }
  });
}

// x [N,V] (V > 0), out [N]. One pass over memory per row (row_stats); a row whose max is
// +-inf (all -inf, or any +inf) gives that max, where x - max would make NaNs.
void CpuBackend::logsumexp_forward(const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), "logsumexp_forward", [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), v = x.size(1);
    const T* px = x.data<T>();
    T* po = out.data<T>();
#pragma omp parallel for schedule(static) if (n * v > kParallelElements)
    for (int64_t row = 0; row < n; ++row) {
      const RowStats<T> st = row_stats(px + row * v, v);
      po[row] = std::isinf(st.max) ? st.max
                                   : static_cast<T>(static_cast<double>(st.max) + std::log(st.sum));
    }
  });
}

// logits [N,V], targets [N] (in range or ignore_index, checked by the caller), losses, lse [N].
// Ignored rows get loss 0; their lse is still computed (it costs the same pass).
void CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                       int64_t ignore_index, Tensor& losses, Tensor& lse) {
  dispatch_float(logits.dtype(), "cross_entropy_forward", [&](auto z) {
    using T = decltype(z);
    dispatch_index(targets.dtype(), "cross_entropy_forward", [&](auto zi) {
      using I = decltype(zi);
      const int64_t n = logits.size(0), v = logits.size(1);
      const T* px = logits.data<T>();
      const I* pt = targets.data<I>();
      T* pl = losses.data<T>();
      T* plse = lse.data<T>();
#pragma omp parallel for schedule(static) if (n * v > kParallelElements)
      for (int64_t row = 0; row < n; ++row) {
        const T* xr = px + row * v;
        const RowStats<T> st = row_stats(xr, v);
        const double l = static_cast<double>(st.max) + std::log(st.sum);
        const int64_t t = static_cast<int64_t>(pt[row]);
        plse[row] = static_cast<T>(l);
        pl[row] = t == ignore_index ? T(0) : static_cast<T>(l - static_cast<double>(xr[t]));
      }
    });
  });
}

// logits, dlogits [N,V], targets, lse [N], scale []: dlogits = scale (exp(x - lse) -
// onehot(t)), zero rows where t == ignore_index.
void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                        const Tensor& lse, int64_t ignore_index,
                                        int64_t vocab_start, const Tensor& scale_t,
                                        Tensor& dlogits) {
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&](auto z) {
    using T = decltype(z);
    dispatch_index(targets.dtype(), "cross_entropy_backward", [&](auto zi) {
      using I = decltype(zi);
      const int64_t n = logits.size(0), v = logits.size(1);
      const T* px = logits.data<T>();
      const I* pt = targets.data<I>();
      const T* plse = lse.data<T>();
      T* pd = dlogits.data<T>();
      const T scale = scale_t.data<T>()[0];
#pragma omp parallel for schedule(static) if (n * v > kParallelElements)
      for (int64_t row = 0; row < n; ++row) {
        const T* xr = px + row * v;
        T* dr = pd + row * v;
        const int64_t t = static_cast<int64_t>(pt[row]);
        if (t == ignore_index) {
          std::fill_n(dr, v, T(0));
          continue;
        }
        const T l = plse[row];
#pragma omp simd
        for (int64_t i = 0; i < v; ++i) dr[i] = scale * exp_vec(xr[i] - l);
        const int64_t local = t - vocab_start;
        if (local >= 0 && local < v) dr[local] -= scale;
      }
    });
  });
}

// logits [N,V] (dlogits on return, when scale is defined), targets, losses [N], scale []: the
// arithmetic of cross_entropy_forward then cross_entropy_backward on the same row, so the fused
// classifier's numbers equal the unfused head's bit for bit. The target's logit is read before
// the row is overwritten.
void CpuBackend::cross_entropy_with_dlogits(Tensor& logits, const Tensor& targets,
                                            int64_t ignore_index, const Tensor& scale_t,
                                            Tensor& losses) {
  dispatch_float(logits.dtype(), "cross_entropy_with_dlogits", [&](auto z) {
    using T = decltype(z);
    dispatch_index(targets.dtype(), "cross_entropy_with_dlogits", [&](auto zi) {
      using I = decltype(zi);
      const int64_t n = logits.size(0), v = logits.size(1);
      T* px = logits.data<T>();
      const I* pt = targets.data<I>();
      T* pl = losses.data<T>();
      const bool grad = scale_t.defined();
      const T scale = grad ? scale_t.data<T>()[0] : T(0);
#pragma omp parallel for schedule(static) if (n * v > kParallelElements)
      for (int64_t row = 0; row < n; ++row) {
        T* xr = px + row * v;
        const RowStats<T> st = row_stats(xr, v);
        const double l = static_cast<double>(st.max) + std::log(st.sum);
        const int64_t t = static_cast<int64_t>(pt[row]);
        pl[row] = t == ignore_index ? T(0) : static_cast<T>(l - static_cast<double>(xr[t]));
        if (!grad) continue;
        if (t == ignore_index) {
          std::fill_n(xr, v, T(0));
          continue;
        }
        const T lse = static_cast<T>(l);  // rounded as the unfused forward caches it
#pragma omp simd
        for (int64_t i = 0; i < v; ++i) xr[i] = scale * exp_vec(xr[i] - lse);
        xr[t] -= scale;
      }
    });
  });
}

// out [1] = 1 / (targets != ignore_index), 0 when none is counted.
void CpuBackend::inverse_target_count(const Tensor& targets, int64_t ignore_index, Tensor& out) {
  const int64_t n = targets.numel();
  int64_t count = 0;
  auto scan = [&](const auto* p) {
    for (int64_t i = 0; i < n; ++i) count += static_cast<int64_t>(p[i]) != ignore_index;
  };
  if (targets.dtype() == DType::I32)
    scan(targets.data<int32_t>());
  else
    scan(targets.data<int64_t>());
  dispatch_float(out.dtype(), "inverse_target_count", [&](auto z) {
    using T = decltype(z);
    out.data<T>()[0] = count == 0 ? T(0) : static_cast<T>(1.0 / static_cast<double>(count));
  });
}

}  // namespace mod::cpu
