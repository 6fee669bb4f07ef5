// Throughput measurement (see throughput.h).
#include "grid/throughput.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/random.h"
#include "model/flops.h"
#include "model/transformer.h"
#include "parallel/adamw.h"

namespace mod::grid {

Throughput measure_throughput(const modtrain::RunConfig& cfg, int timed_steps) {
  const auto& m = cfg.model();
  const auto& t = cfg.train();
  model::Transformer model(m, t.seed());
  model.set_fused_classifier(t.fusions().classifier());  // as the trainer runs it
  parallel::AdamW optimizer(model.named_parameters(), cfg.optimizer());
  const int64_t b = t.batch_size(), s = m.seq_len();
  Rng rng(t.seed());
  std::vector<int64_t> ids(static_cast<size_t>(b * (s + 1)));
  for (auto& id : ids) id = rng.below(m.vocab_size());
  std::vector<int64_t> in, target;  // x_BT and its next tokens
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < s; ++i) {
      in.push_back(ids[r * (s + 1) + i]);
      target.push_back(ids[r * (s + 1) + i + 1]);
    }
  const Tensor x_BT = Tensor::from_indices(in, {b, s}), y_BT = Tensor::from_indices(target, {b, s});

  std::vector<double> times;
  for (int step = 0; step <= timed_steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    model.zero_grad();
    for (int micro = 0; micro < t.grad_accum(); ++micro) {
      const model::ForwardResult r = model.forward(x_BT, y_BT);
      backward(scale(r.loss, 1.0 / t.grad_accum()));
    }
    optimizer.step(cfg.optimizer().lr());
    if (step > 0)  // step 0 warms caches and the allocator
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  Throughput out;
  out.seconds_per_step = times[times.size() / 2];
  const double tokens = static_cast<double>(b) * t.grad_accum() * static_cast<double>(s);
  out.tokens_per_second = tokens / out.seconds_per_step;
  out.flops_per_second = out.tokens_per_second * model::count_flops(m).training_per_token;
  return out;
}

}  // namespace mod::grid
