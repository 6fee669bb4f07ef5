// The layers a transformer block is made of: its norms (model.norm), causal self-attention with
// RoPE (and its KV cache for sampling), the MLP, the MoD router and the causal-routing predictor.
// Shape legend: B batch, T tokens, D width, H heads, Dh head dim.
#pragma once

#include <memory>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/autograd.h"
#include "core/nn/module.h"

namespace mod::model {

// Per-block KV cache for sampling: a routed block stores only the tokens that entered it. Two
// kinds: the growing one of Transformer::decode_step (one sequence, positions on the host), and
// the static one of batched decoding (len defined): B sequences with fixed capacity S, each
// with its own length on the device; a step appends the token of sequence b only where admit[b]
// (undefined: every sequence) and attends to that sequence's slots [0, len[b]). With rows, the
// step's tokens are a gathered [1,N] run and token i belongs to sequence rows[i].
struct KvCache {
  Tensor k, v;               // [max_len, H, Dh]; static: [B,S,H,Dh]
  std::vector<int64_t> pos;  // original position of each cached token (growing kind only)
  Tensor len;                // static kind: i64 [B], tokens cached per sequence
  Tensor admit;              // static kind: i64 [B], this step's admitted sequences (or undefined)
  Tensor rows;               // static kind: i64 [N], the sequence of each gathered token (or undefined)
  int64_t size() const { return static_cast<int64_t>(pos.size()); }
};

// A norm over d_model of the kind model.norm names (RMS or LAYER), eps model.norm_eps: every
// norm of the model is made here, so the choice reaches them all.
std::shared_ptr<nn::Norm> make_norm(const modtrain::ModelConfig& cfg, DType dtype);

class Attention : public nn::Module {
 public:
  Attention(const modtrain::ModelConfig& cfg, Rng& rng, DType dtype);
  // x [B,T,D] at positions pos [B,T] (ascending) -> [B,T,D]. With a growing cache (B = 1), the
  // tokens' K/V are appended to it and the queries attend to everything cached; with a static
  // one (T = 1), each admitted sequence's K/V are appended and every query attends to its own
  // sequence's cached tokens.
  Tensor forward(const Tensor& x, const Tensor& pos, KvCache* cache = nullptr) const;

 private:
  int64_t head_dim_;
  double rope_theta_;
  std::shared_ptr<nn::Linear> wq_, wk_, wv_, wo_;
};

// up, GELU (or SwiGLU with gate), down. fuse_gelu: a GELU MLP runs as one op, gelu_mlp
// (train.fusions.gelu_mlp); up's input hook and down's output hook (tensor parallelism's column
// and row splits) stay around it.
class Mlp : public nn::Module {
 public:
  Mlp(const modtrain::ModelConfig& cfg, Rng& rng, DType dtype, bool fuse_gelu = false);
  Tensor forward(const Tensor& x) const;

 private:
  bool swiglu_, fuse_gelu_;
  std::shared_ptr<nn::Linear> up_, gate_, down_;
};

// Routing scores are ranked (top-C, expert choice) and thresholded (causal routing), so they are
// computed in the master weights' precision under a narrower autocast: bf16's 8 bits would tie
// close scores, and top-C hands ties to the earlier position, a bias toward early tokens.
template <class Fn>
Tensor in_master_precision(const nn::Linear& layer, Fn&& fn) {
  const auto compute = autocast_dtype();
  const DType master = layer.weight().dtype();
  if (!compute || dtype_size(*compute) >= dtype_size(master)) return fn();
  AutocastGuard wide(master);
  return fn();
}

// layer(x) [..., 1] for a one-output layer, in its weights' precision (in_master_precision).
// fused: x narrower than the weights is read as it is (row_scores, train.fusions.router_scores)
// instead of cast to their dtype first; the same scores, bit for bit on the CPU.
Tensor master_precision_scores(const nn::Linear& layer, const Tensor& x, bool fused);

// r = w.x (+ b): one scalar per token, in the master weights' precision even under a narrower
// autocast (top-C ranks these scores; the predictor's logit layer likewise).
class Router : public nn::Module {
 public:
  Router(int64_t d_model, bool bias, Rng& rng, double init_std, DType dtype, bool fused = false);
  Tensor scores(const Tensor& x) const;  // x [B,T,D] -> [B,T]

 private:
  std::shared_ptr<nn::Linear> proj_;
  bool fused_;
};

// Causal-routing predictor: two layers on the detached block input, logit per token.
class Predictor : public nn::Module {
 public:
  Predictor(int64_t d_model, int64_t hidden, Rng& rng, double init_std, DType dtype,
            bool fused = false);
  Tensor logits(const Tensor& x) const;  // x [B,T,D] (detached by the caller) -> [B,T]

 private:
  std::shared_ptr<nn::Linear> in_, out_;
  bool fused_;
};

}  // namespace mod::model
