// CUDA AdamW: one fused in-place pass over param, grad and both moments, the arithmetic of
// core/cpu/ops/optim.cpp (one definition: core/adamw_element.h). The step's constants (decay,
// bias-corrected step size) are computed on the host in double and read from a device tensor,
// so a captured step (CUDA graph) uses the current step's; the per-element math runs in Acc<T>
// (so a bf16 model keeps f32 constants and rounds only when storing p, m and v). And the
// global-norm clip factor.
// Work split: per tensor, one grid-stride loop over the flat index (coalesced, any n); the
// multi-tensor update, one block per chunk of kMultiTensorChunk elements of any tensor in a
// device table (one launch for a whole model). Each element is read and written by one thread,
// so in-place updates need no synchronisation. The norm's sum of squares over the same kind of
// table: one block per chunk writes an f64 partial, one block adds the partials (deterministic).
#include <algorithm>
#include <cmath>

#include "core/adamw_element.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {

// Run-invariant constants, built on the host like the CPU's; the per-step ones come from
// `step` = {1 - lr * weight_decay, lr / (1 - beta1^step), 1 / sqrt(1 - beta2^step)} (f64).
template <typename A>
struct AdamWParams {
  A b1, b2;               // beta1, beta2
  A one_b1, one_b2;       // 1 - beta1, 1 - beta2
  A eps;
};

template <typename T>
AdamWParams<Acc<T>> adamw_params(const AdamWArgs& args) {
  using A = Acc<T>;
  AdamWParams<A> c;
  c.b1 = static_cast<A>(args.beta1);
  c.b2 = static_cast<A>(args.beta2);
  c.one_b1 = static_cast<A>(1.0 - args.beta1);
  c.one_b2 = static_cast<A>(1.0 - args.beta2);
  c.eps = static_cast<A>(args.eps);
  return c;
}

struct AccSqrt {
  template <typename A>
  __device__ A operator()(A x) const { return acc_sqrt(x); }
};

template <typename T>
__device__ AdamWElementConsts<Acc<T>> element_consts(const AdamWParams<Acc<T>>& h,
                                                      const double* step, const T* scale) {
  using A = Acc<T>;
  AdamWElementConsts<A> c;
  c.b1 = h.b1;
  c.b2 = h.b2;
  c.one_b1 = h.one_b1;
  c.one_b2 = h.one_b2;
  c.eps = h.eps;
  c.decay = static_cast<A>(step[0]);
  c.step_size = static_cast<A>(step[1]);
  c.rsqrt_bc2 = static_cast<A>(step[2]);
  c.scale = scale ? load(scale) : A(1);
  return c;
}

// Element i of one tensor: read, adamw_element in Acc<T>, store (p also into copy, rounded to
// C as convert rounds it, when there is one).
template <typename T, typename C>
__device__ __forceinline__ void adamw_at(int64_t i, T* p, const T* g, T* m, T* v, C* copy,
                                         const AdamWElementConsts<Acc<T>>& c) {
  using A = Acc<T>;
  A pi = load(p + i), mi = load(m + i), vi = load(v + i);
  adamw_element(pi, mi, vi, load(g + i), c, AccSqrt{});
  m[i] = from_acc<T>(mi);
  v[i] = from_acc<T>(vi);
  const T stored = from_acc<T>(pi);
  p[i] = stored;
  if (copy) copy[i] = from_acc<C>(static_cast<Acc<C>>(to_acc(stored)));
}

// param, grad, m, v [n], in place, with g = grad * *scale (1 when scale is null).
template <typename T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, AdamWParams<Acc<T>> h,
                             const double* step, const T* scale) {
  const auto c = element_consts<T>(h, step, scale);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    adamw_at<T, T>(i, p, g, m, v, nullptr, c);
}

// Block b's chunk of a multi-tensor table: its entry (the last whose first_chunk <= b, by
// bisection over the entries) and the element range [begin, end) of that entry it covers.
struct TableChunk {
  MultiTensorEntry e;
  int64_t begin, end;
};
__device__ TableChunk table_chunk(const MultiTensorEntry* table, int entries, int64_t b) {
  int lo = 0, hi = entries - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first_chunk <= b) lo = mid;
    else hi = mid - 1;
  }
  const MultiTensorEntry e = table[lo];
  const int64_t begin = (b - e.first_chunk) * kMultiTensorChunk;
  return {e, begin, e.numel < begin + kMultiTensorChunk ? e.numel : begin + kMultiTensorChunk};
}

// Every tensor of `table` in one launch: block b takes its chunk (table_chunk), its threads
// stride over it.
template <typename T, typename C>
__global__ void adamw_multi_tensor_kernel(const MultiTensorEntry* table, int entries,
                                          AdamWParams<Acc<T>> h, const T* scale) {
  const auto [e, begin, end] = table_chunk(table, entries, blockIdx.x);
  const auto c = element_consts<T>(h, e.consts, scale);
  T* p = static_cast<T*>(e.param);
  const T* g = static_cast<const T*>(e.grad);
  T *m = static_cast<T*>(e.m), *v = static_cast<T*>(e.v);
  C* copy = static_cast<C*>(e.copy);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    adamw_at<T, C>(i, p, g, m, v, copy, c);
}

// The table's rows written from kernel parameters, kRowsPerWrite per launch (3 KB, under the
// 4 KB parameter limit): unlike a host-to-device copy this can be captured in a CUDA graph.
constexpr int kRowsPerWrite = 48;
struct TableRows {
  MultiTensorEntry rows[kRowsPerWrite];
  int count;
};
static_assert(sizeof(TableRows) < 4000, "kernel parameters are limited to 4 KB");

__global__ void write_table_kernel(MultiTensorEntry* table, TableRows batch) {
  if (static_cast<int>(threadIdx.x) < batch.count) table[threadIdx.x] = batch.rows[threadIdx.x];
}

// entries -> the device table (ceil(entries / kRowsPerWrite) launches); returns its rows.
MultiTensorEntry* table_rows(const std::vector<MultiTensorEntry>& entries, Tensor& table,
                             bool rewrite) {
  auto* rows = static_cast<MultiTensorEntry*>(table.raw_data());
  if (!rewrite) return rows;
  for (size_t first = 0; first < entries.size(); first += kRowsPerWrite) {
    TableRows batch{};
    batch.count = static_cast<int>(std::min<size_t>(kRowsPerWrite, entries.size() - first));
    std::copy_n(entries.begin() + static_cast<std::ptrdiff_t>(first), batch.count, batch.rows);
    write_table_kernel<<<1, kRowsPerWrite, 0, compute_stream()>>>(rows + first, batch);
    MOD_CUDA_CHECK_LAUNCH();
  }
  return rows;
}

// Chunks the table's rows cover (entries non-empty).
int64_t table_chunks(const std::vector<MultiTensorEntry>& entries) {
  const MultiTensorEntry& last = entries.back();
  return last.first_chunk + (last.numel + kMultiTensorChunk - 1) / kMultiTensorChunk;
}
}  // namespace

void CudaBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                               const AdamWArgs& args, const Tensor& consts,
                               const Tensor& grad_scale) {
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_float(param.dtype(), "adamw_update", [&](auto z) {
    using T = decltype(z);
    adamw_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
        param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), n, adamw_params<T>(args),
        consts.data<double>(), grad_scale.defined() ? grad_scale.data<T>() : nullptr);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::adamw_update_multi(const std::vector<AdamWSlot>& slots, const AdamWArgs& args,
                                     const Tensor& grad_scale,
                                     const std::vector<MultiTensorEntry>& entries, Tensor& table,
                                     bool rewrite) {
  if (entries.empty()) return;
  const MultiTensorEntry* rows = table_rows(entries, table, rewrite);
  const int64_t chunks = table_chunks(entries);
  const int count = static_cast<int>(entries.size());
  const Tensor* first_copy = nullptr;
  for (const AdamWSlot& s : slots)
    if (s.copy.defined()) {
      first_copy = &s.copy;
      break;
    }
  dispatch_float(slots.front().param.dtype(), "adamw_update_multi", [&](auto z) {
    using T = decltype(z);
    const T* scale = grad_scale.defined() ? grad_scale.data<T>() : nullptr;
    if (!first_copy) {
      adamw_multi_tensor_kernel<T, T><<<static_cast<unsigned>(chunks), kThreads, 0,
                                        compute_stream()>>>(rows, count, adamw_params<T>(args),
                                                            scale);
      MOD_CUDA_CHECK_LAUNCH();
      return;
    }
    dispatch_float(first_copy->dtype(), "adamw_update_multi", [&](auto y) {
      using C = decltype(y);
      adamw_multi_tensor_kernel<T, C><<<static_cast<unsigned>(chunks), kThreads, 0,
                                        compute_stream()>>>(rows, count, adamw_params<T>(args),
                                                            scale);
      MOD_CUDA_CHECK_LAUNCH();
    });
  });
}

namespace {
template <typename T>
__global__ void clip_factor_kernel(const double* sq, double max_norm, double* norm, T* factor) {
  const double n = sqrt(sq[0]);
  *norm = n;
  *factor = from_acc<T>(static_cast<Acc<T>>(max_norm > 0 && n > max_norm ? max_norm / (n + 1e-6) : 1.0));
}
}  // namespace

namespace {
// Block b writes the sum of its chunk's squares (in double) to partial[b].
template <typename T>
__global__ void sum_squares_multi_tensor_kernel(const MultiTensorEntry* table, int entries,
                                                double* partial) {
  __shared__ double scratch[32];
  const int64_t b = blockIdx.x;
  const auto [e, begin, end] = table_chunk(table, entries, b);
  const T* x = static_cast<const T*>(e.grad);
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = static_cast<double>(load(x + i));
    acc += v * v;
  }
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[b] = acc;
}

// partial [n] -> out [1], one block: each thread adds a fixed stride of the partials, then the
// block's tree; the order depends on n alone (n = 0 writes 0).
__global__ void sum_partials_kernel(const double* partial, int64_t n, double* out) {
  __shared__ double scratch[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) *out = acc;
}
}  // namespace

void CudaBackend::sum_squares_multi(const std::vector<Tensor>& xs,
                                    const std::vector<MultiTensorEntry>& entries, Tensor& table,
                                    bool rewrite, Tensor& out) {
  if (entries.empty()) {  // no elements: the sum is 0
    sum_partials_kernel<<<1, kThreads, 0, compute_stream()>>>(nullptr, 0, out.data<double>());
    MOD_CUDA_CHECK_LAUNCH();
    return;
  }
  const MultiTensorEntry* rows = table_rows(entries, table, rewrite);
  const int64_t chunks = table_chunks(entries);
  Tensor partial = Tensor::empty({chunks}, DType::F64, Device::CUDA);
  dispatch_float(xs.front().dtype(), "sum_squares_multi", [&](auto z) {
    using T = decltype(z);
    sum_squares_multi_tensor_kernel<T><<<static_cast<unsigned>(chunks), kThreads, 0,
                                         compute_stream()>>>(
        rows, static_cast<int>(entries.size()), partial.data<double>());
    MOD_CUDA_CHECK_LAUNCH();
  });
  sum_partials_kernel<<<1, kThreads, 0, compute_stream()>>>(partial.data<double>(), chunks,
                                                            out.data<double>());
  MOD_CUDA_CHECK_LAUNCH();
}

void CudaBackend::clip_factor(const Tensor& sq, double max_norm, Tensor& norm, Tensor& factor) {
  dispatch_float(factor.dtype(), "clip_factor", [&](auto z) {
    using T = decltype(z);
    clip_factor_kernel<<<1, 1, 0, compute_stream()>>>(sq.data<double>(), max_norm,
                                                      norm.data<double>(), factor.data<T>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mod::cuda
