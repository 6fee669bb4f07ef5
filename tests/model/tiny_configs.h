// Small model configs for model tests: vocabulary 32, width 16, 2 heads, 2 blocks (block 1
// routed when MoD is on), sequences of 12 tokens, capacity 0.25 (C = 3).
#pragma once

#include "configs/modtrain.pb.h"

namespace mod::test {

inline modtrain::ModelConfig tiny_model(bool mod) {
  modtrain::ModelConfig m;
  m.set_vocab_size(32);
  m.set_d_model(16);
  m.set_n_layers(2);
  m.set_n_heads(2);
  m.set_d_ff(32);
  m.set_seq_len(12);
  m.set_init_std(0.3);  // large enough that routing decisions and logits vary
  m.mutable_mod()->set_enabled(mod);
  m.mutable_mod()->set_capacity(0.25);
  m.mutable_mod()->mutable_causal()->set_predictor_hidden(8);
  return m;
}

}  // namespace mod::test
