// Token splits and evaluation (see evaluate.h).
#include "train/evaluate.h"

#include <cmath>
#include <stdexcept>

#include "core/autograd.h"
#include "train/data/loader.h"

namespace mod::train {

data::Dataset load_dataset(const std::string& dir, int64_t model_vocab) {
  data::Dataset d = data::Dataset::open(dir);
  if (d.vocab_size() != model_vocab)
    throw std::invalid_argument("config: model.vocab_size " + std::to_string(model_vocab) +
                                " does not match the data's vocabulary " +
                                std::to_string(d.vocab_size()) + " (" + dir + ")");
  return d;
}

void check_evaluable(const data::ShardSet& tokens, int64_t seq_len, int64_t batch) {
  if (tokens.windows(seq_len) < static_cast<uint64_t>(batch))
    throw std::invalid_argument(
        "evaluate: " + tokens.origin() + ": " + std::to_string(tokens.tokens()) +
        " validation tokens in " + std::to_string(tokens.files().size()) + " shard(s) give " +
        std::to_string(tokens.windows(seq_len)) + " windows of " + std::to_string(seq_len + 1) +
        " tokens, fewer than one batch of " + std::to_string(batch) +
        " (give more validation data, a smaller train.batch_size, or train.eval_every 0)");
}

EvalResult evaluate(const model::Transformer& model, const data::ShardSet& tokens,
                    int64_t seq_len, int64_t batch, int64_t max_batches, model::RoutingMode mode,
                    parallel::Communicator* dp, bool lockstep) {
  NoGradGuard no_grad;
  check_evaluable(tokens, seq_len, batch);
  const auto batches = data::sequential_batches(tokens, seq_len, batch, max_batches);
  const size_t stride = dp ? dp->size() : 1, first = dp ? dp->rank() : 0;
  Tensor sums = Tensor::zeros({2}, DType::F64);  // loss sum, tokens
  const Device device = model.parameters().front().device();
  double first_bad = -1;  // the first batch whose loss is not finite, on this rank
  const size_t rounds = (batches.size() + stride - 1) / stride;
  for (size_t i = first; i < (lockstep ? rounds * stride : batches.size()); i += stride) {
    if (i >= batches.size()) {  // lockstep: the ep group's collectives need this rank's forward
      model.forward(batches[0].inputs.to(device), batches[0].targets.to(device), mode);
      continue;
    }
    const double loss =
        model.forward(batches[i].inputs.to(device), batches[i].targets.to(device), mode)
            .lm_loss.item();
    if (!std::isfinite(loss) && first_bad < 0) first_bad = static_cast<double>(i);
    sums.data<double>()[0] += loss;
    sums.data<double>()[1] += static_cast<double>(batches[i].inputs.numel());
  }
  if (dp) dp->all_reduce(sums);
  // Every rank learns of a bad batch anywhere, so all of them stop here together.
  Tensor bad = Tensor::full({1}, first_bad, DType::F64);
  if (dp) dp->all_reduce(bad, parallel::ReduceOp::Max);
  if (const double b = bad.data<double>()[0]; b >= 0)
    throw std::runtime_error(
        "evaluate: " + tokens.origin() + ": batch " + std::to_string(static_cast<int64_t>(b)) +
        " of " + std::to_string(batches.size()) + " gives a non-finite loss with " +
        (mode == model::RoutingMode::TopC ? "top-C" : "causal") +
        " routing (the model's weights or activations overflow or hold NaN)");
  EvalResult r;
  r.loss = sums.data<double>()[0] / static_cast<double>(batches.size());
  r.tokens = static_cast<int64_t>(sums.data<double>()[1]);
  return r;
}

}  // namespace mod::train
