// The tensor-parallel autograd pairs (see tp_mappings.h).
#include "parallel/tp_mappings.h"

#include <stdexcept>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/backend.h"

namespace mod::parallel {

namespace {
// parts [tp, rows, w] (the all-gather result) -> [rows, tp * w]: rank r's columns at r * w.
Tensor interleave_last_dim(const Tensor& parts, const Shape& out_shape, int tp) {
  Tensor out = Tensor::empty(out_shape, parts.dtype(), parts.device());
  const int64_t w = parts.size(-1), rows = parts.numel() / (tp * w);
  const size_t row_bytes = w * dtype_size(parts.dtype());
  for (int r = 0; r < tp; ++r)
    backend_of(out).copy_rows(parts, r * rows * row_bytes, row_bytes, out, r * row_bytes,
                              tp * row_bytes, rows, row_bytes);
  return out;
}

Tensor all_gather_last_dim(const Tensor& x, Communicator& tp) {
  Shape parts_shape = x.shape();
  parts_shape.insert(parts_shape.begin(), tp.size());
  Tensor parts = Tensor::empty(parts_shape, x.dtype(), x.device());
  tp.all_gather(x.view({1, x.numel()}), parts.view({tp.size(), x.numel()}));
  Shape out_shape = x.shape();
  out_shape.back() *= tp.size();
  return interleave_last_dim(parts, out_shape, tp.size());
}

// x [B, T, ...] -> this rank's share [B, T/tp, ...] of the sum over ranks (no autograd).
Tensor reduce_scatter_seq(const Tensor& x, Communicator& tp) {
  const int n = tp.size();
  const int64_t b = x.size(0), t = x.dim() > 1 ? x.size(1) : 0;
  if (x.dim() < 2 || t % n != 0)
    throw std::invalid_argument("reduce_scatter_seq_to_tp: dim 1 (the sequence) of " + describe(x) +
                                " is not divisible by tp " + std::to_string(n));
  const int64_t chunk = x.numel() / b / n;  // one rank's elements of one sequence
  const size_t chunk_bytes = chunk * dtype_size(x.dtype());
  Tensor parts = Tensor::empty({n * b, chunk}, x.dtype(), x.device());  // rank-major
  for (int r = 0; r < n; ++r)
    backend_of(parts).copy_rows(x, r * chunk_bytes, n * chunk_bytes, parts, r * b * chunk_bytes,
                                chunk_bytes, b, chunk_bytes);
  Shape out_shape = x.shape();
  out_shape[1] = t / n;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  tp.reduce_scatter(parts, out.view({b, chunk}));
  return out;
}

// x [B, T/tp, ...] -> [B, T, ...]: rank r's rows at r * T/tp of each sequence (no autograd).
Tensor all_gather_seq(const Tensor& x, Communicator& tp) {
  if (x.dim() < 2)
    throw std::invalid_argument("gather_seq_from_tp: " + describe(x) + " has no sequence dim");
  const int64_t b = x.size(0);
  Shape out_shape = x.shape();
  out_shape[1] *= tp.size();
  return all_gather_last_dim(x.view({b, x.numel() / b}), tp).view(out_shape);
}

// x [B, T, ...] -> this rank's positions [B, T/tp, ...] of each sequence (no autograd).
Tensor own_seq(const Tensor& x, Communicator& tp) {
  const int n = tp.size();
  const int64_t b = x.size(0), t = x.dim() > 1 ? x.size(1) : 0;
  if (x.dim() < 2 || t % n != 0)
    throw std::invalid_argument("split_seq_to_tp: dim 1 (the sequence) of " + describe(x) +
                                " is not divisible by tp " + std::to_string(n));
  const size_t chunk_bytes = x.numel() / b / n * dtype_size(x.dtype());
  Shape out_shape = x.shape();
  out_shape[1] = t / n;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  backend_of(out).copy_rows(x, tp.rank() * chunk_bytes, n * chunk_bytes, out, 0, chunk_bytes, b,
                            chunk_bytes);
  return out;
}

Tensor own_slice(const Tensor& x, Communicator& tp) {
  const int64_t d = x.size(-1);
  if (d % tp.size() != 0)
    throw std::invalid_argument("scatter_to_tp: last dim of " + describe(x) +
                                " is not divisible by tp " + std::to_string(tp.size()));
  const int64_t w = d / tp.size();
  return slice_last_dim(x, tp.rank() * w, w);
}
}  // namespace

Tensor slice_last_dim(const Tensor& x, int64_t start, int64_t len) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  Shape shape = x.shape();
  shape.back() = len;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const size_t es = dtype_size(x.dtype());
  backend_of(out).copy_rows(x, start * es, d * es, out, 0, len * es, rows, len * es);
  return out;
}

Tensor copy_to_tp(const Tensor& x, Communicator& tp) {
  Tensor out = x.view(x.shape());  // shares data, no history
  if (any_requires_grad({x}))
    record(out, Op::CopyToTp, {x}, [&tp](const Tensor& g, const NeedsGrad&) {
      Tensor sum = g.clone();
      tp.all_reduce(sum);
      return std::vector<Tensor>{sum};
    });
  return out;
}

Tensor reduce_from_tp(const Tensor& x, Communicator& tp) {
  Tensor out = x.clone();
  tp.all_reduce(out);
  if (any_requires_grad({x}))
    record(out, Op::ReduceFromTp, {x},
           [](const Tensor& g, const NeedsGrad&) { return std::vector<Tensor>{g}; });
  return out;
}

Tensor gather_from_tp(const Tensor& x, Communicator& tp) {
  Tensor out = all_gather_last_dim(x, tp);
  if (any_requires_grad({x}))
    record(out, Op::GatherFromTp, {x},
           [&tp](const Tensor& g, const NeedsGrad&) { return std::vector<Tensor>{own_slice(g, tp)}; });
  return out;
}

Tensor scatter_to_tp(const Tensor& x, Communicator& tp) {
  Tensor out = own_slice(x, tp);
  if (any_requires_grad({x}))
    record(out, Op::ScatterToTp, {x}, [&tp](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{all_gather_last_dim(g, tp)};
    });
  return out;
}

Tensor gather_seq_from_tp(const Tensor& x, Communicator& tp) {
  Tensor out = all_gather_seq(x, tp);
  if (any_requires_grad({x}))
    record(out, Op::GatherSeqFromTp, {x}, [&tp](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{reduce_scatter_seq(g, tp)};
    });
  return out;
}

Tensor reduce_scatter_seq_to_tp(const Tensor& x, Communicator& tp) {
  Tensor out = reduce_scatter_seq(x, tp);
  if (any_requires_grad({x}))
    record(out, Op::ReduceScatterSeqToTp, {x}, [&tp](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{all_gather_seq(g, tp)};
    });
  return out;
}

Tensor gather_seq_whole_from_tp(const Tensor& x, Communicator& tp) {
  Tensor out = all_gather_seq(x, tp);
  if (any_requires_grad({x}))
    record(out, Op::GatherSeqWholeFromTp, {x}, [&tp](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{own_seq(g, tp)};
    });
  return out;
}

Tensor split_seq_to_tp(const Tensor& x, Communicator& tp) {
  Tensor out = own_seq(x, tp);
  if (any_requires_grad({x}))
    record(out, Op::SplitSeqToTp, {x}, [&tp](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{all_gather_seq(g, tp)};
    });
  return out;
}

namespace {
// idx [B,C] global positions -> the rows this rank holds: local [B,C] (0 elsewhere) and a 0/1
// flag here [B,C,1] in `dtype`.
std::pair<Tensor, Tensor> held_rows(const Tensor& idx, int64_t local_len, Communicator& tp,
                                    DType dtype) {
  Shape flag_shape = idx.shape();
  flag_shape.push_back(1);
  Tensor local = Tensor::empty(idx.shape(), DType::I64, idx.device());
  Tensor here = Tensor::empty(flag_shape, dtype, idx.device());
  backend_of(idx).index_slice(idx, tp.rank() * local_len, local_len, local, here);
  return {local, here};
}
}  // namespace

Tensor gather_routed_rows(const Tensor& x, const Tensor& idx, Communicator& tp) {
  const auto [local, here] = held_rows(idx, x.size(1), tp, x.dtype());
  return reduce_from_tp(mul(gather_rows(x, local), here), tp);
}

Tensor scatter_add_routed_rows(const Tensor& x, const Tensor& idx, const Tensor& y,
                               Communicator& tp) {
  const auto [local, here] = held_rows(idx, x.size(1), tp, y.dtype());
  return scatter_add_rows(x, local, mul(copy_to_tp(y, tp), here));
}

Tensor own_positions(const Tensor& x, Communicator& tp) {
  const int64_t t = x.size(-1) / tp.size();
  return slice_last_dim(x, tp.rank() * t, t);
}

}  // namespace mod::parallel
