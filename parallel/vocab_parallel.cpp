// Vocabulary-parallel embedding and fused cross-entropy (see vocab_parallel.h).
#include "parallel/vocab_parallel.h"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "parallel/tp_mappings.h"

namespace mod::parallel {

namespace {
int64_t id_at(const Tensor& ids, int64_t i) {
  return ids.dtype() == DType::I64 ? ids.data<int64_t>()[i] : ids.data<int32_t>()[i];
}

// Per-row statistics over the whole vocabulary, identical on every tp rank.
struct RowStats {
  Tensor max, sum_exp, target_logit;  // [N] f64
};

template <typename T>
RowStats row_stats(const T* x, const Tensor& targets, int64_t n, int64_t v, int64_t v0,
                   int64_t ignore, Communicator& tp) {
  RowStats s{Tensor::empty({n}, DType::F64), Tensor::empty({n}, DType::F64),
             Tensor::zeros({n}, DType::F64)};
  double* mx = s.max.data<double>();
#pragma omp parallel for if (n * v > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    double m = -INFINITY;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(x[i * v + j]));
    mx[i] = m;
  }
  tp.all_reduce(s.max, ReduceOp::Max);
  double* se = s.sum_exp.data<double>();
  double* tl = s.target_logit.data<double>();
#pragma omp parallel for if (n * v > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0;
    for (int64_t j = 0; j < v; ++j) acc += std::exp(static_cast<double>(x[i * v + j]) - mx[i]);
    se[i] = acc;
    const int64_t t = id_at(targets, i);
    if (t != ignore && t >= v0 && t < v0 + v) tl[i] = static_cast<double>(x[i * v + t - v0]);
  }
  tp.all_reduce(s.sum_exp);
  tp.all_reduce(s.target_logit);
  return s;
}

template <typename T>
void softmax_minus_onehot(const T* x, const RowStats& s, const Tensor& targets, int64_t n,
                          int64_t v, int64_t v0, int64_t ignore, double g, T* dx) {
  const double* mx = s.max.data<double>();
  const double* se = s.sum_exp.data<double>();
#pragma omp parallel for if (n * v > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = id_at(targets, i);
    if (t == ignore) {
      for (int64_t j = 0; j < v; ++j) dx[i * v + j] = T(0);
      continue;
    }
    const double inv = 1.0 / se[i];
    for (int64_t j = 0; j < v; ++j)
      dx[i * v + j] = static_cast<T>(g * std::exp(static_cast<double>(x[i * v + j]) - mx[i]) * inv);
    if (t >= v0 && t < v0 + v) dx[i * v + t - v0] = static_cast<T>(dx[i * v + t - v0] - g);
  }
}
}  // namespace

Tensor vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t vocab_start,
                                Communicator& tp) {
  const int64_t rows = table.size(0), n = ids.numel();
  Tensor local = Tensor::empty(ids.shape(), DType::I64);
  Shape mask_shape = ids.shape();
  mask_shape.push_back(1);
  Tensor mask = Tensor::empty(mask_shape, table.dtype());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = id_at(ids, i) - vocab_start;
    const bool mine = id >= 0 && id < rows;
    local.data<int64_t>()[i] = mine ? id : 0;
    mask.set(i, mine ? 1.0 : 0.0);
  }
  return reduce_from_tp(mul(embedding(local, table), mask), tp);
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, Communicator& tp, int64_t ignore_index) {
  const int64_t v = logits.size(-1), n = logits.numel() / v;
  if (targets.numel() != n || !is_index(targets.dtype()))
    throw std::invalid_argument("vocab_parallel_cross_entropy: targets " + describe(targets) +
                                " must be integer with one entry per row of logits " +
                                describe(logits));
  if (logits.dtype() != DType::F32 && logits.dtype() != DType::F64)
    throw std::invalid_argument("vocab_parallel_cross_entropy: logits must be f32 or f64, got " +
                                describe(logits));
  const bool f64 = logits.dtype() == DType::F64;
  RowStats s = f64 ? row_stats(logits.data<double>(), targets, n, v, vocab_start, ignore_index, tp)
                   : row_stats(logits.data<float>(), targets, n, v, vocab_start, ignore_index, tp);
  double total = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (id_at(targets, i) == ignore_index) continue;
    total += std::log(s.sum_exp.data<double>()[i]) + s.max.data<double>()[i] -
             s.target_logit.data<double>()[i];
    ++counted;
  }
  Tensor loss = Tensor::scalar(counted ? total / counted : 0.0, logits.dtype());
  if (any_requires_grad({logits})) {
    Tensor saved = detach(logits);
    record(loss, Op::VocabParallelCrossEntropy, {logits},
           [saved, s, targets, n, v, vocab_start, ignore_index, counted](const Tensor& g,
                                                                         const NeedsGrad&) {
             Tensor dx = Tensor::empty(saved.shape(), saved.dtype());
             const double scale = counted ? g.item() / counted : 0.0;
             if (saved.dtype() == DType::F64)
               softmax_minus_onehot(saved.data<double>(), s, targets, n, v, vocab_start,
                                    ignore_index, scale, dx.data<double>());
             else
               softmax_minus_onehot(saved.data<float>(), s, targets, n, v, vocab_start,
                                    ignore_index, scale, dx.data<float>());
             return std::vector<Tensor>{dx};
           });
  }
  return loss;
}

}  // namespace mod::parallel
