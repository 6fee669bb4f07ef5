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

// y[i] = f(x[i]); f is a generic lambda taking the element, instantiated per float type.
template <typename F>
void map_forward(const char* name, const Tensor& x, Tensor& y, F f) {
  dispatch_float(x.dtype(), name, [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) py[i] = f(px[i]);
  });
}

// dx[i] = dy[i] * f'(x[i]); fprime takes the element and returns the local derivative.
template <typename F>
void map_backward(const char* name, const Tensor& x, const Tensor& dy, Tensor& dx, F fprime) {
  dispatch_float(x.dtype(), name, [&](auto z) {
    using T = decltype(z);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) pdx[i] = pdy[i] * fprime(px[i]);
  });
}
}  // namespace

// y = x sigmoid(2u), u = c0 (x + c1 x^3).
void CpuBackend::gelu_forward(const Tensor& x, Tensor& y) {
  map_forward("gelu_forward", x, y, [](auto v) {
    using T = decltype(v);
    const T u = T(kGeluC0) * (v + T(kGeluC1) * v * v * v);
    return v * sigmoid_vec(T(2) * u);
  });
}

// With s = sigmoid(2u): dy/dx = s + 2 x s (1 - s) du/dx.
void CpuBackend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  map_backward("gelu_backward", x, dy, dx, [](auto v) {
    using T = decltype(v);
    const T c0 = T(kGeluC0), c1 = T(kGeluC1);
    const T u = c0 * (v + c1 * v * v * v);
    const T du = c0 * (T(1) + T(3) * c1 * v * v);
    const T s = sigmoid_vec(T(2) * u);
    return s + T(2) * v * s * (T(1) - s) * du;
  });
}

// y = sigmoid(x).
void CpuBackend::sigmoid_forward(const Tensor& x, Tensor& y) {
  map_forward("sigmoid_forward", x, y, [](auto v) { return sigmoid_vec(v); });
}

// dsigmoid/dx = s (1 - s), s recomputed from the input.
void CpuBackend::sigmoid_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  map_backward("sigmoid_backward", x, dy, dx, [](auto v) {
    const auto s = sigmoid_vec(v);
    return s * (decltype(v)(1) - s);
  });
}

// y = x sigmoid(x).
void CpuBackend::silu_forward(const Tensor& x, Tensor& y) {
  map_forward("silu_forward", x, y, [](auto v) { return v * sigmoid_vec(v); });
}

// dsilu/dx = s (1 + x (1 - s)), s = sigmoid(x).
void CpuBackend::silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  map_backward("silu_backward", x, dy, dx, [](auto v) {
    using T = decltype(v);
    const T s = sigmoid_vec(v);
    return s * (T(1) + v * (T(1) - s));
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
