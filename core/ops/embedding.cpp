// embedding: ids [...] (i32/i64) pick rows of table [V,D] -> [..., D]. Backward scatters the
// output gradient into a zeroed [V,D] table gradient, or into the table's existing gradient,
// so repeated ids accumulate; ids get none.
#include "core/ops/embedding.h"

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"

namespace mod {

namespace {
constexpr const char* kOp = "embedding";
}  // namespace

Tensor embedding(const Tensor& ids, const Tensor& table) {
  check::index(kOp, ids, "ids");
  check::floating(kOp, table, "table");
  check::dim(kOp, table, 2, "table");
  check::same_device(kOp, ids, "ids", table, "table");
  const int64_t vocab = table.size(0), d = table.size(1), n = ids.numel();
  check::indices_in_range(kOp, ids, vocab, "ids");

  Shape out_shape = ids.shape();
  out_shape.push_back(d);
  Tensor out = Tensor::empty(out_shape, table.dtype(), table.device());
  const Tensor ids_n = ids.view({n});
  Tensor out_nd = out.view({n, d});
  backend_of(table).embedding_forward(ids_n, table, out_nd);

  if (any_requires_grad({table})) {
    // Once the table holds a gradient, the scatter adds into it (accumulating_leaf_grad).
    const Tensor leaf = table.grad_fn() ? Tensor() : table;
    record(out, Op::Embedding, {table},
           [ids_n, leaf, vocab, d](const Tensor& g, const NeedsGrad&) {
             const Tensor* acc = accumulating_leaf_grad(leaf, g);
             Tensor dtable = acc ? *acc : Tensor::zeros({vocab, d}, g.dtype(), g.device());
             backend_of(g).embedding_backward(ids_n, g.view({ids_n.numel(), d}), dtable);
             return std::vector<Tensor>{dtable};
           });
  }
  return out;
}

}  // namespace mod
