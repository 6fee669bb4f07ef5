// One training step of a model, two micro-batches accumulated as the trainer does (each loss
// scaled by 1/2), kept as everything a bitwise comparison of two ways to compute it looks at:
// losses, routing, MoE statistics and every gradient. Used by the recomputation and fusion
// tests, which require an alternative path to give NONE's / the unfused model's step exactly.
#pragma once

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "model/transformer.h"
#include "tests/support/bitwise.h"
#include "tests/support/tiny_configs.h"

namespace mod::test {

struct StepOutcome {
  std::vector<std::vector<double>> losses, routed_idx;  // per micro-batch
  std::vector<double> moe_stats;  // per MoE layer run: block, noop fraction, selection counts
  std::map<std::string, std::vector<double>> grads;
};

// Batch 2 of tokens_for(seeds 100 + micro, targets 200 + micro).
inline StepOutcome two_micro_batch_step(model::Transformer& model,
                                        const modtrain::ModelConfig& cfg) {
  StepOutcome out;
  for (int micro = 0; micro < 2; ++micro) {
    const Tensor tokens = tokens_for(2, cfg.seq_len(), cfg.vocab_size(), 100 + micro);
    const Tensor targets = tokens_for(2, cfg.seq_len(), cfg.vocab_size(), 200 + micro);
    model::ForwardResult r = model.forward(tokens, targets);
    backward(scale(r.loss, 0.5));
    out.losses.push_back(
        {r.loss.item(), r.lm_loss.item(), r.aux_loss.defined() ? r.aux_loss.item() : -1.0});
    for (const Tensor& idx : r.routed_idx) out.routed_idx.push_back(idx.to_vector());
    for (const model::MoeStats& s : r.moe_stats) {
      out.moe_stats.push_back(s.block);
      out.moe_stats.push_back(s.noop_fraction);
      for (double c : s.counts.to_vector()) out.moe_stats.push_back(c);
    }
  }
  for (const auto& [name, p] : model.named_parameters())
    out.grads[name] = p.grad().defined() ? p.grad().to_vector() : std::vector<double>{};
  return out;
}

// Bitwise: every loss, routed index, MoE statistic and gradient (each gradient present).
inline void check_same(const StepOutcome& got, const StepOutcome& want) {
  CHECK(got.losses == want.losses);
  CHECK(got.routed_idx == want.routed_idx);
  CHECK(got.moe_stats == want.moe_stats);
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& [name, g] : want.grads) {
    INFO("gradient of " << name);
    CHECK_FALSE(g.empty());
    check_bitwise(got.grads.at(name), g);
  }
}

}  // namespace mod::test
