// CUDA pointwise activations, forward and backward, over flat arrays of any shape: the formulas
// of core/cpu/ops/activation.cpp term for term, evaluated in Acc<T>. GELU is the tanh
// approximation written as x sigmoid(2u), so every rule here is a sigmoid. exp is the accurate
// expf/exp (within 2 ulp, like the CPU's exp_cephes), never the __expf intrinsic.
// Work split: pointwise.cuh's wide kernels (16-byte loads and stores); each rule is a functor
// so one kernel template serves all of them (no --extended-lambda needed). Outputs may alias
// inputs, so no __restrict__.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/pointwise.cuh"

namespace mod::cuda {

namespace {
constexpr double kGeluC0 = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC1 = 0.044715;

// y = x sigmoid(2u), u = c0 (x + c1 x^3).
struct GeluForward {
  template <typename A>
  __device__ A operator()(A v) const {
    const A u = A(kGeluC0) * (v + A(kGeluC1) * v * v * v);
    return v * acc_sigmoid(A(2) * u);
  }
};
// With s = sigmoid(2u): dy/dx = s + 2 x s (1 - s) du/dx.
struct GeluGrad {
  template <typename A>
  __device__ A operator()(A v) const {
    const A c0 = A(kGeluC0), c1 = A(kGeluC1);
    const A u = c0 * (v + c1 * v * v * v);
    const A du = c0 * (A(1) + A(3) * c1 * v * v);
    const A s = acc_sigmoid(A(2) * u);
    return s + A(2) * v * s * (A(1) - s) * du;
  }
};
struct SigmoidForward {
  template <typename A>
  __device__ A operator()(A v) const {
    return acc_sigmoid(v);
  }
};
// s (1 - s), s recomputed from the input.
struct SigmoidGrad {
  template <typename A>
  __device__ A operator()(A v) const {
    const A s = acc_sigmoid(v);
    return s * (A(1) - s);
  }
};
struct SiluForward {
  template <typename A>
  __device__ A operator()(A v) const {
    return v * acc_sigmoid(v);
  }
};
// s (1 + x (1 - s)), s = sigmoid(x).
struct SiluGrad {
  template <typename A>
  __device__ A operator()(A v) const {
    const A s = acc_sigmoid(v);
    return s * (A(1) + v * (A(1) - s));
  }
};

// dx = dy * f'(x), as op(x, dy)
template <typename F>
struct TimesDerivative {
  F fprime;
  template <typename A>
  __device__ A operator()(A x, A dy) const {
    return dy * fprime(x);
  }
};

// y = silu(gate) up, as op(gate, up)
struct SwigluForward {
  template <typename A>
  __device__ A operator()(A g, A up) const {
    return g * acc_sigmoid(g) * up;
  }
};

template <typename F>
void map_forward(const char* name, const Tensor& x, Tensor& y, F f) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), name, [&](auto z) {
    using T = decltype(z);
    launch_pointwise(n, x.data<T>(), y.data<T>(), f);
  });
}

template <typename F>
void map_backward(const char* name, const Tensor& x, const Tensor& dy, Tensor& dx, F fprime) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(x.dtype(), name, [&](auto z) {
    using T = decltype(z);
    launch_pointwise(n, x.data<T>(), dy.data<T>(), dx.data<T>(), TimesDerivative<F>{fprime});
  });
}

// gate, up, dy, dgate, dup [n]: dgate = dy up silu'(gate), dup = dy silu(gate)
template <typename T>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* dy, T* dgate, T* dup,
                                       int64_t n) {
  using A = Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const A g = load(gate + i), u = load(up + i), d = load(dy + i);
    const A s = acc_sigmoid(g);
    dgate[i] = from_acc<T>(d * u * s * (A(1) + g * (A(1) - s)));
    dup[i] = from_acc<T>(d * g * s);
  }
}
}  // namespace

void CudaBackend::gelu_forward(const Tensor& x, Tensor& y) {
  map_forward("gelu_forward", x, y, GeluForward{});
}

void CudaBackend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  map_backward("gelu_backward", x, dy, dx, GeluGrad{});
}

void CudaBackend::sigmoid_forward(const Tensor& x, Tensor& y) {
  map_forward("sigmoid_forward", x, y, SigmoidForward{});
}

void CudaBackend::sigmoid_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  map_backward("sigmoid_backward", x, dy, dx, SigmoidGrad{});
}

void CudaBackend::silu_forward(const Tensor& x, Tensor& y) {
  map_forward("silu_forward", x, y, SiluForward{});
}

void CudaBackend::silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  map_backward("silu_backward", x, dy, dx, SiluGrad{});
}

void CudaBackend::swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  dispatch_float(gate.dtype(), "swiglu_forward", [&](auto z) {
    using T = decltype(z);
    launch_pointwise(n, gate.data<T>(), up.data<T>(), y.data<T>(), SwigluForward{});
  });
}

void CudaBackend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy,
                                  Tensor& dgate, Tensor& dup) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  dispatch_float(gate.dtype(), "swiglu_backward", [&](auto z) {
    using T = decltype(z);
    swiglu_backward_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
        gate.data<T>(), up.data<T>(), dy.data<T>(), dgate.data<T>(), dup.data<T>(), n);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mod::cuda
