// CPU pointwise activations, forward and backward, over flat arrays of any shape. Each is one
// vectorised pass (exp via exp_vec, no libm calls in f32 loops), OpenMP-split above the
// parallel threshold. GELU uses 0.5 (1 + tanh(u)) = sigmoid(2u), so every rule here is a sigmoid.
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/vec_math.h"

namespace mod::cpu {

namespace {
constexpr double kGeluC0 = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC1 = 0.044715;
}  // namespace

// x, y: any shape, same numel. y = x sigmoid(2u), u = c0 (x + c1 x^3).
void CpuBackend::gelu_forward(const Tensor& x, Tensor& y) {
  dispatch_float(x.dtype(), "gelu_forward", [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
    const T c0 = static_cast<T>(kGeluC0), c1 = static_cast<T>(kGeluC1);
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const T v = px[i];
      const T u = c0 * (v + c1 * v * v * v);
      py[i] = v * sigmoid_vec(T(2) * u);
    }
  });
}

// x, dy, dx: same numel. With s = sigmoid(2u): dy/dx = s + 2 x s (1 - s) du/dx.
void CpuBackend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  dispatch_float(x.dtype(), "gelu_backward", [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = x.numel();
    const T c0 = static_cast<T>(kGeluC0), c1 = static_cast<T>(kGeluC1);
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const T v = px[i];
      const T u = c0 * (v + c1 * v * v * v);
      const T du = c0 * (T(1) + T(3) * c1 * v * v);
      const T s = sigmoid_vec(T(2) * u);
      pdx[i] = pdy[i] * (s + T(2) * v * s * (T(1) - s) * du);
    }
  });
}

// x, y: same numel. y = sigmoid(x).
void CpuBackend::sigmoid_forward(const Tensor& x, Tensor& y) {
  dispatch_float(x.dtype(), "sigmoid_forward", [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) py[i] = sigmoid_vec(px[i]);
  });
}

// x, dy, dx: same numel. dx = dy s (1 - s), s = sigmoid(x) recomputed from the input.
void CpuBackend::sigmoid_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  dispatch_float(x.dtype(), "sigmoid_backward", [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const T s = sigmoid_vec(px[i]);
      pdx[i] = pdy[i] * s * (T(1) - s);
    }
  });
}

// x, y: same numel. y = x sigmoid(x).
void CpuBackend::silu_forward(const Tensor& x, Tensor& y) {
  dispatch_float(x.dtype(), "silu_forward", [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) py[i] = px[i] * sigmoid_vec(px[i]);
  });
}

// x, dy, dx: same numel. d silu/dx = s (1 + x (1 - s)), s = sigmoid(x).
void CpuBackend::silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  dispatch_float(x.dtype(), "silu_backward", [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const T s = sigmoid_vec(px[i]);
      pdx[i] = pdy[i] * s * (T(1) + px[i] * (T(1) - s));
    }
  });
}

// gate, up, y: same numel. y = silu(gate) up.
void CpuBackend::swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) {
  dispatch_float(gate.dtype(), "swiglu_forward", [&](auto z) {
    using T = decltype(z);
    const T* pg = gate.data<T>();
    const T* pu = up.data<T>();
    T* py = y.data<T>();
    const int64_t n = gate.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) py[i] = pg[i] * sigmoid_vec(pg[i]) * pu[i];
  });
}

// gate, up, dy, dgate, dup: same numel. dgate = dy up silu'(gate), dup = dy silu(gate).
void CpuBackend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy,
                                 Tensor& dgate, Tensor& dup) {
  dispatch_float(gate.dtype(), "swiglu_backward", [&](auto z) {
    using T = decltype(z);
    const T* pg = gate.data<T>();
    const T* pu = up.data<T>();
    const T* pdy = dy.data<T>();
    T* pdg = dgate.data<T>();
    T* pdu = dup.data<T>();
    const int64_t n = gate.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const T g = pg[i];
      const T s = sigmoid_vec(g);
      pdg[i] = pdy[i] * pu[i] * s * (T(1) + g * (T(1) - s));
      pdu[i] = pdy[i] * g * s;
    }
  });
}

}  // namespace mod::cpu
