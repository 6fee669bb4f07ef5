// The mixture-of-experts MLP (see moe.h).
#include "model/moe.h"

#include <cmath>
#include <stdexcept>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/weight_copy.h"
#include "model/layers.h"

namespace mod::model {

// --- experts ---

Experts::Experts(int64_t n_experts, int64_t d_model, int64_t d_hidden, bool swiglu,
                 double init_std, double out_std, Rng& rng, DType dtype)
    : swiglu_(swiglu) {
  up_ = register_parameter("up", randn({n_experts, d_hidden, d_model}, rng, dtype, init_std));
  if (swiglu_)
    gate_ = register_parameter("gate", randn({n_experts, d_hidden, d_model}, rng, dtype, init_std));
  down_ = register_parameter("down", randn({n_experts, d_model, d_hidden}, rng, dtype, out_std));
}

Tensor Experts::forward(const Tensor& x) const {
  if (x.dim() != 3 || x.size(0) != local_count())
    throw std::invalid_argument("experts: input " + describe(x) + " must be [" +
                                std::to_string(local_count()) + ",S,D], one row block per local expert");
  // Batched x[e] @ W[e]^T: [E,S,D] x [E,F,D]^T -> [E,S,F].
  const Tensor xs = autocast(x), up = autocast(up_);
  Tensor h = swiglu_ ? swiglu(matmul(xs, autocast(gate_), false, true), matmul(xs, up, false, true))
                     : gelu(matmul(xs, up, false, true));
  return matmul(h, autocast(down_), false, true);
}

Tensor Experts::forward_one(int64_t i, const Tensor& x) const {
  if (grad_enabled()) throw std::logic_error("Experts::forward_one is for NoGradGuard scopes");
  const int64_t f = up_.size(1), d = up_.size(2);
  // Expert i's slice of the stacked weight's copy where it keeps one (the cast of the master's
  // slice, bit for bit; under ZeRO-3 the copy is all that is gathered), else of the master.
  auto w = [&](const Tensor& t, int64_t rows, int64_t cols) {
    const auto dtype = autocast_dtype();
    if (const Tensor copy = dtype ? weight_copy_for(t, *dtype) : Tensor(); copy.defined())
      return copy.narrow0(i, 1).view({rows, cols});
    return autocast(t.narrow0(i, 1).view({rows, cols}));
  };
  const Tensor xs = autocast(x);
  Tensor h = swiglu_ ? swiglu(linear(xs, w(gate_, f, d)), linear(xs, w(up_, f, d)))
                     : gelu(linear(xs, w(up_, f, d)));
  return linear(h, w(down_, d, f));
}

void Experts::shard(int64_t first, int64_t count) {
  if (first < 0 || count < 1 || first + count > up_.size(0))
    throw std::invalid_argument("experts: shard [" + std::to_string(first) + ", " +
                                std::to_string(first + count) + ") is outside the " +
                                std::to_string(up_.size(0)) + " experts held");
  auto keep = [&](const Tensor& t) { return t.narrow0(first, count).clone(); };
  up_ = replace_parameter("up", keep(up_));
  if (swiglu_) gate_ = replace_parameter("gate", keep(gate_));
  down_ = replace_parameter("down", keep(down_));
  first_ += first;
}

// --- the layer ---

void resolve_moe_stats(std::vector<MoeStats>& stats) {
  for (MoeStats& s : stats) {
    if (s.top_k == 0) continue;
    const SelectionStats st = selection_stats(s.counts, s.share, s.tokens, s.top_k, s.token_choice);
    s.unrouted_fraction = st.unrouted_fraction;
    s.dropped_fraction = st.dropped_fraction;
    s.max_load = st.max_load;
    s.counts = s.share = s.slots = Tensor();
    s.top_k = 0;
  }
}

MoeMlp::MoeMlp(const modtrain::ModelConfig& cfg, Rng& rng, DType dtype)
    : cfg_(cfg.moe()), n_all_(cfg.moe().n_experts() + (cfg.moe().noop_expert() ? 1 : 0)) {
  const int64_t d = cfg.d_model(), f = cfg_.d_expert() > 0 ? cfg_.d_expert() : cfg.d_ff();
  const double std = cfg.init_std(), out_std = std / std::sqrt(2.0 * cfg.n_layers());
  router_ = register_module("router", std::make_shared<nn::Linear>(d, n_all_, cfg_.router_bias(), rng, std, dtype));
  experts_ = register_module(
      "experts", std::make_shared<Experts>(cfg_.n_experts(), d, f, cfg.mlp() == modtrain::ModelConfig::SWIGLU,
                                           std, out_std, rng, dtype));
}

// z-loss: mean over tokens of logsumexp(logits)^2 (ST-MoE), keeping router logits small.
// Balance (token choice): per sequence E * sum_e f_e * mean_t p_e (Switch), averaged over
// sequences, so a dp rank's share of the batch gives the same mean as one process.
Tensor MoeMlp::aux_losses(const Tensor& logits_in, const Tensor& probs_in,
                          const MoeSelection& sel) const {
  const Tensor logits = loss_precision(logits_in), probs = loss_precision(probs_in);
  Tensor aux;
  if (cfg_.z_weight() > 0) {
    Tensor lse = logsumexp(logits);  // [B,T]
    aux = scale(mean(mul(lse, lse)), cfg_.z_weight());
  }
  if (cfg_.routing() == modtrain::MoEConfig::TOKEN_CHOICE && cfg_.balance_weight() > 0) {
    const int64_t b = probs.size(0), t = probs.size(1), e = cfg_.n_experts();
    Tensor ones = Tensor::full({b, 1, t}, 1.0 / static_cast<double>(t), probs.dtype(), probs.device());
    Tensor mean_p = matmul(ones, probs);  // [B,1,E]
    Tensor f = sel.share.view({b, 1, e});
    if (f.dtype() != probs.dtype()) f = f.to(probs.dtype());
    Tensor balance = scale(sum(mul(mean_p, f)), cfg_.balance_weight() * static_cast<double>(e) / b);
    aux = aux.defined() ? add(aux, balance) : balance;
  }
  return aux;
}

MoeOutput MoeMlp::forward(const Tensor& x) const {
  if (!sequence_.gather) return forward_whole(x);
  MoeOutput result = forward_whole(sequence_.gather(x));
  result.out = sequence_.split(result.out);
  return result;
}

MoeOutput MoeMlp::forward_whole(const Tensor& x) const {
  if (x.dim() != 3) throw std::invalid_argument("moe: input " + describe(x) + " must be [B,T,D]");
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), e = cfg_.n_experts();
  MoeOutput result;
  Tensor logits = in_master_precision(*router_, [&] { return router_->forward(x); });  // [B,T,E']
  Tensor probs = softmax(logits);
  const MoeSelection sel = select_experts(detach(probs), cfg_);
  result.stats.noop_fraction = sel.noop_fraction;
  result.stats.counts = sel.counts;
  result.stats.share = sel.share;
  result.stats.slots = sel.rows;
  result.stats.tokens = t;
  result.stats.token_choice = !sel.all_valid;
  result.stats.top_k = sel.all_valid ? 1 : cfg_.top_k();
  result.aux = aux_losses(logits, probs, sel);
  const int64_t k = sel.k, s = b * k;
  if (k == 0) {  // the no-op expert took every token
    result.out = Tensor::zeros({b, t, d}, x.dtype(), x.device());
    return result;
  }
  // Slot (e, r, j) reads row rows[slot] of x viewed as [1, B*T, D]; its gate is probs at
  // gate_rows[slot] of probs viewed as [1, B*T*E', 1].
  const Tensor idx = sel.rows.view({1, e * s});
  // A token several experts chose repeats in idx: the scatters go one expert's slots at a time.
  Tensor xs = reshape(gather_rows(reshape(x, {1, b * t, d}), idx, e), {e, s, d});
  Tensor ys = exchange_.dispatch ? exchange_.combine(experts_->forward(exchange_.dispatch(xs)))
                                 : experts_->forward(xs);
  Tensor gates = gather_rows(reshape(probs, {1, b * t * n_all_, 1}), sel.gate_rows.view({1, e * s}));
  // Empty token-choice slots: gate 0, so neither output nor gradient.
  if (!sel.all_valid) gates = mul(gates, sel.valid.view({1, e * s, 1}));
  // A token that several experts chose sums their outputs in expert order, in f32 at least (the
  // gates' precision): bf16 would round every add.
  const auto as = [](const Tensor& v, DType dtype) { return v.dtype() == dtype ? v : cast(v, dtype); };
  const DType acc = gates.dtype();
  Tensor out = scatter_add_rows(Tensor::zeros({1, b * t, d}, acc, x.device()), idx,
                                mul(as(reshape(ys, {1, e * s, d}), acc), gates), e);
  result.out = as(reshape(out, {b, t, d}), x.dtype());
  return result;
}

Tensor MoeMlp::forward_causal(const Tensor& x) const {
  if (grad_enabled()) throw std::logic_error("causal MoE routing is for NoGradGuard scopes");
  if (experts_->local_count() != cfg_.n_experts())
    throw std::logic_error("causal MoE routing needs every expert on this rank (ep = 1)");
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), n = b * t;
  const int64_t picks = cfg_.routing() == modtrain::MoEConfig::TOKEN_CHOICE ? cfg_.top_k() : 1;
  const Tensor rows = x.view({n, d});
  const Tensor logits = in_master_precision(*router_, [&] { return router_->forward(x); });
  const Tensor probs = softmax(logits).to(Device::CPU).to(DType::F64);  // [B,T,E']
  const double* p = probs.data<double>();
  Tensor out = Tensor::zeros({n, d}, x.dtype(), x.device());
  std::vector<std::vector<int64_t>> by_expert(cfg_.n_experts());
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> order(n_all_);
    for (int64_t e = 0; e < n_all_; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + picks, order.end(), [&](int64_t a, int64_t c) {
      return p[i * n_all_ + a] != p[i * n_all_ + c] ? p[i * n_all_ + a] > p[i * n_all_ + c] : a < c;
    });
    for (int64_t c = 0; c < picks; ++c)
      if (order[c] < cfg_.n_experts()) by_expert[order[c]].push_back(i);  // the no-op adds nothing
  }
  for (int64_t e = 0; e < cfg_.n_experts(); ++e) {
    const auto& toks = by_expert[e];
    if (toks.empty()) continue;
    const int64_t m = static_cast<int64_t>(toks.size());
    Tensor idx = Tensor::from_indices(toks, {1, m}).to(x.device());
    Tensor y = experts_->forward_one(e, gather_rows(rows.view({1, n, d}), idx).view({m, d}));
    std::vector<double> g(m);
    for (int64_t j = 0; j < m; ++j) g[j] = p[toks[j] * n_all_ + e];
    y = mul(y.view({1, m, d}), Tensor::from_vector(g, {1, m, 1}, x.dtype()).to(x.device()));
    out = scatter_add_rows(out.view({1, n, d}), idx, y).view({n, d});
  }
  return out.view({b, t, d});
}

}  // namespace mod::model
