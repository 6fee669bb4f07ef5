// The AdamW arithmetic of one element, shared by every update kernel: the CPU's and the CUDA
// backend's, per tensor (adamw_update) and multi-tensor (adamw_update_multi). One definition is
// what makes the multi-tensor update equal the per-tensor one bitwise on each backend.
// Plain C++ (host) that nvcc also compiles for the device; A is the arithmetic type (the CPU's
// T, CUDA's Acc<T>), sqrt the backend's correctly rounded square root.
#pragma once

#if defined(__CUDACC__)
#define MOD_HOST_DEVICE __host__ __device__
#else
#define MOD_HOST_DEVICE
#endif

namespace mod {

// Everything an element's update multiplies by: the run's hyper-parameters and the step's
// constants (adamw_step_constants: decay = 1 - lr wd, step_size = lr / (1 - beta1^step),
// rsqrt_bc2 = 1 / sqrt(1 - beta2^step)), and the clip factor every gradient entry is scaled by.
template <typename A>
struct AdamWElementConsts {
  A b1, b2, one_b1, one_b2, eps;
  A decay, step_size, rsqrt_bc2;
  A scale;
};

// In place on p, m, v, with g = grad * scale:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = (1 - lr wd) p - step_size m / (sqrt(v) rsqrt_bc2 + eps)
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename A, typename Sqrt>
MOD_HOST_DEVICE inline void adamw_element(A& p, A& m, A& v, A grad,
                                          const AdamWElementConsts<A>& c, Sqrt sqrt_of) {
  const A g = grad * c.scale;  // exact when scale is 1
  m = c.b1 * m + c.one_b1 * g;
  v = c.b2 * v + c.one_b2 * g * g;
  p = c.decay * p - c.step_size * m / (sqrt_of(v) * c.rsqrt_bc2 + c.eps);
}

}  // namespace mod
