// attention: validation and the autograd rule of the fused causal attention kernel. Forward
// caches lse [B,H,T]; backward recomputes the probabilities from it (no T x S buffer is kept).
#include "core/ops/attention.h"

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"
#include "core/recompute.h"

namespace mod {

namespace {
constexpr const char* kOp = "attention";

std::string at(const char* arg, int64_t b, int64_t i) {
  return std::string(arg) + "[" + std::to_string(b) + ", " + std::to_string(i) + "]";
}

// pos: an index tensor of the expected shape, on q's device. Returns its values (CPU only;
// empty for device tensors, whose kernels trust the caller) after checking that each row is
// strictly increasing.
std::vector<int64_t> check_positions(const Tensor& pos, const char* arg, const Shape& expected,
                                     const char* dims, const Tensor& q) {
  check::index(kOp, pos, arg);
  if (pos.shape() != expected)
    check::fail(kOp, std::string(arg) + " " + shape_str(pos.shape()) + " must be " + dims + " = " +
                         shape_str(expected) + " for q " + shape_str(q.shape()));
  check::same_device(kOp, pos, arg, q, "q");
  if (pos.device() != Device::CPU) return {};
  std::vector<int64_t> p(static_cast<size_t>(pos.numel()));
  for (int64_t i = 0; i < pos.numel(); ++i)
    p[i] = pos.dtype() == DType::I32 ? pos.data<int32_t>()[i] : pos.data<int64_t>()[i];
  const int64_t cols = expected[1];
  for (int64_t b = 0; b < expected[0]; ++b)
    for (int64_t i = 1; i < cols; ++i) {
      const int64_t prev = p[b * cols + i - 1], cur = p[b * cols + i];
      if (cur <= prev)
        check::fail(kOp, std::string(arg) + " row " + std::to_string(b) +
                             " is not strictly increasing: " + at(arg, b, i) + " = " +
                             std::to_string(cur) + " after " + at(arg, b, i - 1) + " = " +
                             std::to_string(prev));
    }
  return p;
}
}  // namespace

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                 const Tensor& k_pos) {
  check::floating(kOp, q, "q");
  check::floating(kOp, k, "k");
  check::floating(kOp, v, "v");
  check::same_dtype_device(kOp, q, "q", k, "k");
  check::same_dtype_device(kOp, q, "q", v, "v");
  check::dim(kOp, q, 4, "q [B,T,H,Dh]");
  check::dim(kOp, k, 4, "k [B,S,H,Dh]");
  check::same_shape(kOp, k, "k", v, "v");
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), Dh = q.size(3), S = k.size(1);
  if (k.size(0) != B || k.size(2) != H || k.size(3) != Dh)
    check::fail(kOp, "q " + shape_str(q.shape()) + " [B,T,H,Dh] and k " + shape_str(k.shape()) +
                         " [B,S,H,Dh] must agree in B, H and Dh");
  if (Dh == 0) check::fail(kOp, "head dim Dh of q " + shape_str(q.shape()) + " is 0");
  const std::vector<int64_t> qp = check_positions(q_pos, "q_pos", {B, T}, "[B,T]", q);
  const std::vector<int64_t> kp = check_positions(k_pos, "k_pos", {B, S}, "[B,S]", q);
  if (q_pos.device() == Device::CPU && T > 0) {
    // Rows are sorted, so a row's first query sees the fewest keys.
    for (int64_t b = 0; b < B; ++b) {
      const std::string query = "query " + at("q_pos", b, 0) + " = " + std::to_string(qp[b * T]);
      if (S == 0) check::fail(kOp, query + " sees no key: k " + shape_str(k.shape()) + " is empty");
      if (kp[b * S] > qp[b * T])
        check::fail(kOp, query + " sees no key: the first, " + at("k_pos", b, 0) + " = " +
                             std::to_string(kp[b * S]) + ", is later");
    }
  }

  Tensor out, lse;
  // Selective recomputation hands back the forward's output and statistics.
  if (!replay_costly_outputs(Op::Attention, {&out, &lse})) {
    out = Tensor::empty(q.shape(), q.dtype(), q.device());
    lse = Tensor::empty({B, H, T}, stats_dtype(q.dtype()), q.device());
    backend_of(q).attention_forward(q, k, v, q_pos, k_pos, out, lse);
    keep_costly_outputs(Op::Attention, {out, lse});
  }
  if (any_requires_grad({q, k, v})) {
    record(out, Op::Attention, {q, k, v},
           [q = detach(q), k = detach(k), v = detach(v), q_pos, k_pos, o = detach(out), lse](
               const Tensor& g, const NeedsGrad& needs) {
             Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.device());
             Tensor dk = Tensor::empty(k.shape(), k.dtype(), k.device());
             Tensor dv = Tensor::empty(v.shape(), v.dtype(), v.device());
             backend_of(g).attention_backward(q, k, v, q_pos, k_pos, o, lse, g, dq, dk, dv);
             return std::vector<Tensor>{needs[0] ? dq : Tensor(), needs[1] ? dk : Tensor(),
                                        needs[2] ? dv : Tensor()};
           });
  }
  return out;
}

}  // namespace mod
