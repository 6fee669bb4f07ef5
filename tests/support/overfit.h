// The overfitting check the model tests share: a tiny model trained for `steps` full steps
// (forward, backward, clipping at 1, AdamW at lr 1e-2 after 10 warm-up steps, no decay) on one
// fixed batch of 4 x 12 tokens over a vocabulary of 32. A model that learns drives its loss from
// about ln 32 = 3.47 to near 0; one whose gradients are wrong or cut does not.
#pragma once

#include <functional>

#include "model/transformer.h"
#include "parallel/adamw.h"
#include "tests/support/tiny_configs.h"
#include "train/grad_clip.h"
#include "train/lr_schedule.h"

namespace mod::test {

struct OverfitLosses {
  double first = 0;  // the language-model loss at step 0
  double last = 0;   // and at the last step
};

// after_first_backward, if set, sees the model once, with step 0's gradients in place.
inline OverfitLosses overfit_fixed_batch(
    model::Transformer& m, int steps = 200,
    const std::function<void(model::Transformer&)>& after_first_backward = {}) {
  modtrain::OptimizerConfig opt;
  opt.set_lr(1e-2);
  opt.set_warmup_steps(10);
  opt.set_weight_decay(0.0);
  parallel::AdamW adam(m.named_parameters(), opt);
  const Tensor in = tokens_for(4, 12, 32, 2), tgt = tokens_for(4, 12, 32, 3);
  OverfitLosses out;
  for (int step = 0; step < steps; ++step) {
    m.zero_grad();
    auto r = m.forward(in, tgt);
    r.loss.backward();
    if (step == 0 && after_first_backward) after_first_backward(m);
    train::clip_grad_norm(m.parameters(), 1.0);
    adam.step(train::learning_rate(opt, step, steps));
    if (step == 0) out.first = r.lm_loss.item();
    out.last = r.lm_loss.item();
  }
  return out;
}

}  // namespace mod::test
