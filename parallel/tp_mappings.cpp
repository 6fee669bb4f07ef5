// The tensor-parallel autograd pairs (see tp_mappings.h).
#include "parallel/tp_mappings.h"

#include <stdexcept>

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

}  // namespace mod::parallel
