// Vocabulary-parallel embedding and cross-entropy (see vocab_parallel.h). Everything runs
// through the tensor backend, the per-row bookkeeping (which rank holds a token's row) included
// (index_slice), so both work on the CPU and on a GPU without waiting for the host.
#include "parallel/vocab_parallel.h"

#include <stdexcept>
#include <string>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "parallel/tp_mappings.h"

namespace mod::parallel {

namespace {
// For each row of ids: its row in this rank's slice [start, start + rows) (0 when elsewhere)
// and a 0/1 flag saying whether the slice holds it, both on ids' device.
struct SliceRows {
  Tensor local;  // i64, ids' shape
  Tensor here;   // `dtype`, ids' shape + [1]
};

SliceRows slice_rows(const Tensor& ids, int64_t start, int64_t rows, DType dtype) {
  Shape flag_shape = ids.shape();
  flag_shape.push_back(1);
  SliceRows s{Tensor::empty(ids.shape(), DType::I64, ids.device()),
              Tensor::empty(flag_shape, dtype, ids.device())};
  backend_of(ids).index_slice(ids, start, rows, s.local, s.here);
  return s;
}
}  // namespace

Tensor vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t vocab_start,
                                Communicator& tp, bool split_sequence) {
  const SliceRows s = slice_rows(ids, vocab_start, table.size(0), table.dtype());
  const Tensor partial = mul(embedding(s.local, table), s.here);
  return split_sequence ? reduce_scatter_seq_to_tp(partial, tp) : reduce_from_tp(partial, tp);
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

  // Counted rows: targets inside the whole vocabulary, i.e. not ignore_index.
  const Tensor targets1 = targets.view({n});
  check_targets("vocab_parallel_cross_entropy", targets1, vocab, ignore_index);
  const SliceRows s = slice_rows(targets1, vocab_start, v, dtype);
  const Tensor counted_rows = slice_rows(targets1, 0, vocab, dtype).here.view({n});
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
  Tensor inv_count = Tensor::empty({}, dtype, device);
  be.inverse_target_count(targets1, ignore_index, inv_count);
  be.binary(BinaryKind::Mul, Broadcast::Same, 1, 1, loss, inv_count, loss);

  // d logits = (softmax over the whole vocabulary - onehot) / counted on the local slice: the
  // backward needs no communication.
  if (any_requires_grad({logits}))
    record_cross_entropy_grad(loss, Op::VocabParallelCrossEntropy, logits, targets, lse,
                              ignore_index, vocab_start, inv_count);
  return loss;
}

}  // namespace mod::parallel
