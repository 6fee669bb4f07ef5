// The expert-parallel autograd pair (see expert_parallel.h). Two helpers hold the data movement,
// to_experts ([E, S, D] -> [E/ep, ep * S/tp, D]) and from_experts (its inverse); each op's
// forward is one of them and its backward the other.
// Invariant: outputs never share storage with inputs (the all-to-all always lands in a fresh
// buffer), so a backward rule may return them as fresh gradients.
#include "parallel/expert_parallel.h"

#include <stdexcept>
#include <string>

#include "core/autograd.h"
#include "core/backend.h"

namespace mod::parallel {

namespace {
std::string s(int64_t v) { return std::to_string(v); }

// x is a defined 3-D floating tensor; the permutations below are 2-D copies on its device.
void check_3d(const char* op, const char* arg, const Tensor& x) {
  if (!x.defined()) throw std::invalid_argument(std::string(op) + ": " + arg + " is undefined");
  if (x.dim() != 3 || !is_floating(x.dtype()))
    throw std::invalid_argument(std::string(op) + ": " + arg + " " + describe(x) +
                                " must be a 3-D floating tensor ([E, S, D] expert slots)");
}

// src viewed as [rows][cols] blocks of `block` elements -> [cols][rows] blocks, shaped `shape`.
// With one row or one column the layout is unchanged: a view, no copy.
Tensor transpose_blocks(const Tensor& src, int64_t rows, int64_t cols, int64_t block,
                        const Shape& shape) {
  if (rows == 1 || cols == 1) return src.view(shape);
  Tensor out = Tensor::empty(shape, src.dtype(), src.device());
  const size_t bytes = static_cast<size_t>(block) * dtype_size(src.dtype());
  for (int64_t c = 0; c < cols; ++c)  // source column c -> destination row c
    backend_of(out).copy_rows(src, c * bytes, cols * bytes, out, c * rows * bytes, bytes, rows,
                              bytes);
  return out;
}

// x [E, S, D] -> [E/ep, ep * S/tp, D]: own tp share of every expert's slots, all-to-all over ep,
// then source-major slots per local expert.
Tensor to_experts(const char* op, const Tensor& x, Communicator& ep, Communicator& tp) {
  check_3d(op, "x", x);
  const int64_t P = ep.size(), T = tp.size(), E = x.size(0), S = x.size(1), D = x.size(2);
  if (E % P != 0)
    throw std::invalid_argument(std::string(op) + ": x " + describe(x) + ": experts E=" + s(E) +
                                " not divisible by ep=" + s(P) +
                                " (each ep rank keeps E/ep consecutive experts)");
  if (S % T != 0)
    throw std::invalid_argument(std::string(op) + ": x " + describe(x) +
                                ": expert slots S=" + s(S) + " not divisible by tp=" + s(T) +
                                " (each tp rank dispatches its S/tp share)");
  if (P == 1 && T == 1) return x.clone();
  const int64_t El = E / P, sl = S / T, t = tp.rank();

  // send [E, S/tp, D] = slots [t*sl, (t+1)*sl) of each expert; expert-major, so chunk j of the
  // all-to-all is exactly ep rank j's experts.
  Tensor send = x;
  if (T > 1) {
    send = Tensor::empty({E, sl, D}, x.dtype(), x.device());
    const size_t es = dtype_size(x.dtype()), share = static_cast<size_t>(sl * D) * es;
    backend_of(send).copy_rows(x, t * share, S * D * es, send, 0, share, E, share);
  }
  if (P == 1) return send.view({El, sl, D});  // T > 1 here, so send is already a fresh copy
  Tensor recv = Tensor::empty({P, El * sl * D}, x.dtype(), x.device());  // [source rank, local expert, slot, D]
  ep.all_to_all(send.view({P, El * sl * D}), recv);
  return transpose_blocks(recv, P, El, sl * D, {El, P * sl, D});
}

// y [E/ep, ep * S/tp, D] -> [E, S, D]: all-to-all back to the ranks the slots came from, then
// all-gather the tp shares along the slots.
Tensor from_experts(const char* op, const Tensor& y, Communicator& ep, Communicator& tp) {
  check_3d(op, "y", y);
  const int64_t P = ep.size(), T = tp.size(), El = y.size(0), rows = y.size(1), D = y.size(2);
  if (rows % P != 0)
    throw std::invalid_argument(std::string(op) + ": y " + describe(y) + ": dim 1 (ep * S/tp = " +
                                s(rows) + ") not divisible by ep=" + s(P));
  if (P == 1 && T == 1) return y.clone();
  const int64_t sl = rows / P, E = El * P, S = sl * T;

  // send [ep rank, local expert, slot, D]: the slots each source rank sent, in its chunk.
  // A group of one is skipped; the other collective still lands in a fresh buffer.
  Tensor share = y.view({P, El * sl * D});  // = [E, S/tp, D], expert-major
  if (P > 1) {
    Tensor send = transpose_blocks(y, El, P, sl * D, {P, El * sl * D});
    share = Tensor::empty({P, El * sl * D}, y.dtype(), y.device());
    ep.all_to_all(send, share);
  }
  if (T == 1) return share.view({E, S, D});
  Tensor parts = Tensor::empty({T, E * sl * D}, y.dtype(), y.device());  // [tp rank, E, S/tp, D]
  tp.all_gather(share.view({1, E * sl * D}), parts);
  return transpose_blocks(parts, T, E, sl * D, {E, S, D});
}
}  // namespace

Tensor dispatch_to_experts(const Tensor& x, Communicator& ep, Communicator& tp) {
  Tensor out = to_experts("dispatch_to_experts", x, ep, tp);
  if (any_requires_grad({x}))
    record(out, Op::ExpertDispatch, {x}, [&ep, &tp](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{from_experts("dispatch_to_experts backward", g, ep, tp)};
    });
  return out;
}

Tensor combine_from_experts(const Tensor& y, Communicator& ep, Communicator& tp) {
  Tensor out = from_experts("combine_from_experts", y, ep, tp);
  if (any_requires_grad({y}))
    record(out, Op::ExpertCombine, {y}, [&ep, &tp](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{to_experts("combine_from_experts backward", g, ep, tp)};
    });
  return out;
}

}  // namespace mod::parallel
