// The decoder-only transformer with Mixture-of-Depths routing.
// Shape legend: B batch, T tokens, D width, H heads, Dh head dim, V vocabulary, C routed capacity.
//
// MoD invariants kept here (docs/architecture.md section 3):
// - top-C per sequence, never across the batch; indices ascending, ties to the lower position;
// - routed tokens keep their original positions for RoPE and the causal mask;
// - routed tokens get x + g(r) * f(X~) where f is the block's residual delta (attention + MLP,
//   without the residual itself, so the residual is added once); other tokens pass unchanged;
// - the router learns only through g(r) * f, so r stays on the gradient path;
// - causal routing (sampling, causal eval) decides per token from that token's input alone.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/nn/module.h"
#include "model/moe.h"

namespace mod::model {

// TopC: training-time routing (top-C of each sequence). Causal: a token enters a routed block
// iff the predictor (or, without one, the router) gives a logit > 0; sequences are run one by one
// because their routed counts differ.
enum class RoutingMode { TopC, Causal };

// Statistics of one routed block from one forward (no gradient).
struct RoutedBlockStats {
  int block = 0;
  double router_mean = 0, router_std = 0;  // of r over all tokens
  // Causal decision (predictor, or router when there is no predictor) vs top-C membership.
  double accuracy = 0, precision = 0, recall = 0;
  std::vector<double> routed_fraction_by_bucket;  // top-C share per position bucket (8 buckets)
  // Until resolve_stats: the detached router scores, decision logits and top-C membership
  // ([B,T] each), left on their device so that the forward never waits for the host.
  Tensor r, decision, member;
};

// Computes the numbers above from the tensors each entry holds (one host copy each), then
// drops them; entries already resolved are left alone.
void resolve_stats(std::vector<RoutedBlockStats>& stats);

struct ForwardResult {
  Tensor logits;   // [B,T,V] ([B,T,V/tp], this rank's vocabulary slice, under tensor parallelism)
  Tensor lm_loss;  // scalar; undefined without targets
  Tensor aux_loss; // scalar: predictor BCE + weighted router BCE + MoE losses; undefined if none
  Tensor loss;     // lm_loss (+ aux_loss): what backward runs on
  std::vector<RoutedBlockStats> stats;
  std::vector<MoeStats> moe_stats;  // per MoE layer run, in block order
  std::vector<Tensor> routed_idx;  // top-C mode: [B,C] i64 per routed block, in block order
};

// Per-block KV cache for sampling: a routed block stores only the tokens that entered it.
struct KvCache {
  Tensor k, v;                  // [max_len, H, Dh]
  std::vector<int64_t> pos;     // original position of each cached token
  int64_t size() const { return static_cast<int64_t>(pos.size()); }
};

class Attention : public nn::Module {
 public:
  Attention(const modtrain::ModelConfig& cfg, Rng& rng, DType dtype);
  // x [B,T,D] at positions pos [B,T] (ascending) -> [B,T,D]. With a cache (B = 1), the
  // tokens' K/V are appended to it and the queries attend to everything cached.
  Tensor forward(const Tensor& x, const Tensor& pos, KvCache* cache = nullptr) const;

 private:
  int64_t head_dim_;
  double rope_theta_;
  std::shared_ptr<nn::Linear> wq_, wk_, wv_, wo_;
};

class Mlp : public nn::Module {
 public:
  Mlp(const modtrain::ModelConfig& cfg, Rng& rng, DType dtype);
  Tensor forward(const Tensor& x) const;

 private:
  bool swiglu_;
  std::shared_ptr<nn::Linear> up_, gate_, down_;
};

// r = w.x (+ b): one scalar per token.
class Router : public nn::Module {
 public:
  Router(int64_t d_model, bool bias, Rng& rng, double init_std, DType dtype);
  Tensor scores(const Tensor& x) const;  // x [B,T,D] -> [B,T]

 private:
  std::shared_ptr<nn::Linear> proj_;
};

// Causal-routing predictor: two layers on the detached block input, logit per token.
class Predictor : public nn::Module {
 public:
  Predictor(int64_t d_model, int64_t hidden, Rng& rng, double init_std, DType dtype);
  Tensor logits(const Tensor& x) const;  // x [B,T,D] (detached by the caller) -> [B,T]

 private:
  std::shared_ptr<nn::Linear> in_, out_;
};

// One pre-norm block. delta() is f: the block's contribution before the residual add. A
// routed block also owns its router and (for causal method PREDICTOR) its predictor; an MoE
// block has a MoeMlp where others have an Mlp (both named "mlp").
class Block : public nn::Module {
 public:
  Block(const modtrain::ModelConfig& cfg, bool routed, Rng& rng, DType dtype = DType::F32,
        bool moe = false);
  // f(x) = a + mlp(norm2(x + a)), a = attn(norm1(x)); x [B,T,D], pos [B,T]. An MoE MLP routes
  // by mode and adds its auxiliary loss and statistics to *result (dropped when null).
  Tensor delta(const Tensor& x, const Tensor& pos, KvCache* cache = nullptr,
               RoutingMode mode = RoutingMode::TopC, ForwardResult* result = nullptr) const;
  const Router* router() const { return router_.get(); }        // null when dense
  const Predictor* predictor() const { return predictor_.get(); }  // null unless PREDICTOR
  MoeMlp* moe() const { return moe_.get(); }                     // null with a dense MLP

 private:
  std::shared_ptr<nn::RMSNorm> norm1_, norm2_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Mlp> mlp_;
  std::shared_ptr<MoeMlp> moe_;
  std::shared_ptr<Router> router_;
  std::shared_ptr<Predictor> predictor_;
};

// One routed block in training mode, steps in order: router r = w.x; per-sequence top-C of r
// (ascending, ties to the lower position); gather the routed rows; the block's delta f on the
// gathered sub-sequence at its original positions; scale by g(r); scatter-add into x.
struct TopCRouting {
  Tensor out;  // [B,T,D]
  Tensor r;    // [B,T] router logits (on the gradient path)
  Tensor idx;  // [B,C] i64
};
TopCRouting route_top_c(const Block& block, const Tensor& x, const Tensor& pos, int64_t capacity,
                        modtrain::RouterConfig::Gate gate, ForwardResult* result = nullptr);

class Transformer : public nn::Module {
 public:
  // dtype F64 serves the gradient checks; training runs in F32 on the CPU.
  Transformer(const modtrain::ModelConfig& cfg, uint64_t seed, DType dtype = DType::F32);

  // tokens, targets [B,T] (i64); targets may be undefined (no loss).
  ForwardResult forward(const Tensor& tokens, const Tensor& targets,
                        RoutingMode mode = RoutingMode::TopC) const;

  // Sampling: feeds one token at `pos` through the caches (one per block) -> logits [V].
  Tensor decode_step(int64_t token, int64_t pos, std::vector<KvCache>& caches) const;
  std::vector<KvCache> make_caches(int64_t max_len) const;

  const modtrain::ModelConfig& config() const { return cfg_; }
  bool routed(size_t block) const { return routed_[block]; }
  size_t num_blocks() const { return blocks_.size(); }
  MoeMlp* moe(size_t block) const { return blocks_[block]->moe(); }  // null: dense MLP
  // Replaces cross_entropy(logits, targets) for the LM loss (the vocabulary-parallel loss under
  // tensor parallelism, where logits hold this rank's slice of the vocabulary).
  using LmLoss = std::function<Tensor(const Tensor& logits, const Tensor& targets)>;
  void set_lm_loss(LmLoss fn) { lm_loss_ = std::move(fn); }

 private:
  Tensor run_blocks(Tensor x, RoutingMode mode, ForwardResult& result) const;
  Tensor routed_top_c(size_t b, const Tensor& x, const Tensor& pos, ForwardResult& result) const;
  Tensor routed_causal(size_t b, const Tensor& x) const;
  Tensor head(const Tensor& h) const;  // final norm + LM head
  const Tensor& positions(int64_t b, int64_t t, Device device) const;  // [B,T]: 0..T-1 per row
  int64_t capacity(size_t block, int64_t seq_len) const;

  modtrain::ModelConfig cfg_;
  std::vector<bool> routed_;  // per block
  std::vector<bool> moe_;     // per block: an MoE MLP
  std::shared_ptr<nn::Embedding> embed_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<nn::RMSNorm> final_norm_;
  std::shared_ptr<nn::Linear> lm_head_;  // null when tied
  LmLoss lm_loss_;                       // null: cross_entropy
  mutable std::deque<Tensor> positions_;  // positions() made so far (references stay valid)
};

}  // namespace mod::model
