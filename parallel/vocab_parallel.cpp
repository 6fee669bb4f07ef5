// Vocabulary-parallel embedding and cross-entropy (see vocab_parallel.h). The heavy work runs
// through the tensor backend, so both work on the CPU and on a GPU. Per-row bookkeeping (which
// rank holds a token's row) is computed on the host from the B*T ids, which cross_entropy copies
// there anyway to count and check its targets.
#include "parallel/vocab_parallel.h"

#include <stdexcept>
#include <string>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "parallel/tp_mappings.h"

namespace mod::parallel {

namespace {
int64_t id_at(const Tensor& host_ids, int64_t i) {
  return host_ids.dtype() == DType::I64 ? host_ids.data<int64_t>()[i]
                                        : host_ids.data<int32_t>()[i];
}

// For each row of ids: its row in this rank's slice [start, start + rows) (0 when elsewhere)
// and a 0/1 flag saying whether the slice holds it, both on `device`.
struct SliceRows {
  Tensor local;  // i64, ids' shape
  Tensor here;   // `dtype`, ids' shape + [1]
};

SliceRows slice_rows(const Tensor& ids, int64_t start, int64_t rows, DType dtype, Device device) {
  const Tensor host = ids.to(Device::CPU);
  Tensor local = Tensor::empty(ids.shape(), DType::I64);
  Shape flag_shape = ids.shape();
  flag_shape.push_back(1);
  Tensor here = Tensor::empty(flag_shape, dtype);
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = id_at(host, i) - start;
    const bool mine = id >= 0 && id < rows;
    local.data<int64_t>()[i] = mine ? id : 0;
    here.set(i, mine ? 1.0 : 0.0);
  }
  return {local.to(device), here.to(device)};
}
}  // namespace

Tensor vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t vocab_start,
                                Communicator& tp) {
  const SliceRows s = slice_rows(ids, vocab_start, table.size(0), table.dtype(), table.device());
  return reduce_from_tp(mul(embedding(s.local, table), s.here), tp);
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, Communicator& tp, int64_t ignore_index) {
  const int64_t v = logits.size(-1), n = logits.numel() / v, vocab = v * tp.size();
  if (targets.numel() != n || !is_index(targets.dtype()))
    throw std::invalid_argument("vocab_parallel_cross_entropy: targets " + describe(targets) +
                                " must be integer with one entry per row of logits " +
                                describe(logits));
  if (logits.dtype() != DType::F32 && logits.dtype() != DType::F64)
    throw std::invalid_argument("vocab_parallel_cross_entropy: logits must be f32 or f64, got " +
                                describe(logits));
  if (targets.device() != logits.device())
    throw std::invalid_argument("vocab_parallel_cross_entropy: targets " + describe(targets) +
                                " and logits " + describe(logits) + " are on different devices");
  const DType dtype = logits.dtype();
  const Device device = logits.device();
  Backend& be = backend_of(logits);

  // Host side: checked ids, the counted rows, and where each row's target logit lies.
  const Tensor host_targets = targets.to(Device::CPU).view({n});
  const int64_t counted =
      count_targets("vocab_parallel_cross_entropy", host_targets, vocab, ignore_index);
  Tensor counted_host = Tensor::empty({n}, dtype);
  for (int64_t i = 0; i < n; ++i) counted_host.set(i, id_at(host_targets, i) != ignore_index ? 1.0 : 0.0);
  const SliceRows s = slice_rows(host_targets, vocab_start, v, dtype, device);
  const Tensor counted_rows = counted_host.to(device);
  const Tensor rows2 = logits.view({n, v});

  // logsumexp over the whole vocabulary = logsumexp over ranks of each slice's logsumexp:
  // all-gather [tp, n], lay it out [n, tp], reduce each row.
  const int parts = tp.size();
  const size_t es = dtype_size(dtype);
  Tensor lse_here = Tensor::empty({n}, dtype, device);
  be.logsumexp_forward(rows2, lse_here);
  Tensor gathered = Tensor::empty({parts * n}, dtype, device);
  tp.all_gather(lse_here, gathered);
  Tensor by_row = Tensor::empty({n, parts}, dtype, device);
  for (int r = 0; r < parts; ++r)
    be.copy_rows(gathered, r * n * es, es, by_row, r * es, parts * es, n, es);
  Tensor lse = Tensor::empty({n}, dtype, device);
  be.logsumexp_forward(by_row, lse);

  // The target logit, from the one rank whose slice holds it (zero on the others), summed.
  Tensor target_logit = Tensor::empty({n, 1, 1}, dtype, device);
  be.gather_rows(logits.view({n, v, 1}), s.local.view({n, 1}), target_logit);
  be.binary(BinaryKind::Mul, Broadcast::Same, n, 1, target_logit, s.here, target_logit);
  tp.all_reduce(target_logit);

  // Mean over counted rows of lse - target logit; every rank holds the same value.
  Tensor per_row = Tensor::empty({n}, dtype, device);
  be.binary(BinaryKind::Sub, Broadcast::Same, n, 1, lse, target_logit, per_row);
  be.binary(BinaryKind::Mul, Broadcast::Same, n, 1, per_row, counted_rows, per_row);
  Tensor loss = Tensor::empty({}, dtype, device);
  be.sum_all(per_row, loss);
  // The same divisor, rounded the same way, as cross_entropy's inverse_target_count.
  const Tensor inv_count =
      Tensor::scalar(counted ? 1.0 / static_cast<double>(counted) : 0.0, dtype).to(device);
  be.binary(BinaryKind::Mul, Broadcast::Same, 1, 1, loss, inv_count, loss);

  // d logits = (softmax over the whole vocabulary - onehot) / counted on the local slice: the
  // backward needs no communication.
  if (any_requires_grad({logits}))
    record_cross_entropy_grad(loss, Op::VocabParallelCrossEntropy, logits, targets, lse,
                              ignore_index, vocab_start, inv_count);
  return loss;
}

}  // namespace mod::parallel
