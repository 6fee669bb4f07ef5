// The routing of one sequence in both modes (see routing_trace.h).
#include "model/routing_trace.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "core/autograd.h"
#include "model/routing_schedule.h"

namespace mod::model {

namespace {
std::vector<double> host_values(const Tensor& t) {
  return t.to(Device::CPU).to_vector();
}
}  // namespace

RoutingTrace trace_routing(const Transformer& model, const std::vector<int64_t>& tokens) {
  const auto& cfg = model.config();
  const auto n = static_cast<int64_t>(tokens.size());
  if (!cfg.mod().enabled())
    throw std::invalid_argument(
        "routing trace: the model has no routed blocks (model.mod.enabled false)");
  if (n == 0 || n > cfg.seq_len())
    throw std::invalid_argument("routing trace: " + std::to_string(n) +
                                " tokens; expected 1 to model.seq_len " +
                                std::to_string(cfg.seq_len()));
  NoGradGuard no_grad;
  const Device device = model.parameters().front().device();
  const Tensor ids = Tensor::from_indices(tokens, {1, n}).to(device);
  const ForwardResult top = model.forward(ids, Tensor(), RoutingMode::TopC);
  const ForwardResult causal = model.forward(ids, Tensor(), RoutingMode::Causal);
  if (top.stats.size() != causal.stats.size())
    throw std::logic_error("routing trace: the two forwards saw different routed blocks");

  RoutingTrace trace;
  trace.tokens = tokens;
  for (size_t k = 0; k < top.stats.size(); ++k) {
    const RoutedBlockStats &t = top.stats[k], &c = causal.stats[k];
    BlockTrace b;
    b.block = t.block;
    b.router_score = host_values(t.r);
    for (double logit : host_values(t.decision))
      b.decision_prob.push_back(1 / (1 + std::exp(-logit)));
    int64_t agree = 0;
    const auto member = host_values(t.member), admitted = host_values(c.member);
    for (int64_t i = 0; i < n; ++i) {
      b.top_c.push_back(member[i] > 0.5);
      b.causal.push_back(admitted[i] > 0.5);
      agree += b.top_c.back() == b.causal.back();
    }
    b.agreement = static_cast<double>(agree) / static_cast<double>(n);
    if (trace.blocks.empty()) trace.capacity = capacity_tokens(capacity_fractions(cfg)[t.block], n);
    trace.blocks.push_back(std::move(b));
  }
  return trace;
}

std::vector<double> routing_agreement(const Transformer& model, const Tensor& tokens) {
  NoGradGuard no_grad;
  const ForwardResult top = model.forward(tokens, Tensor(), RoutingMode::TopC);
  const ForwardResult causal = model.forward(tokens, Tensor(), RoutingMode::Causal);
  const size_t blocks = top.stats.size();
  const int64_t b = tokens.size(0), t = tokens.size(1);
  // The causal forward runs sequence by sequence: its entries are (sequence, block) in order.
  if (causal.stats.size() != blocks * static_cast<size_t>(b))
    throw std::logic_error("routing agreement: the two forwards saw different routed blocks");
  std::vector<double> agreement;
  for (size_t k = 0; k < blocks; ++k) {
    const auto member = host_values(top.stats[k].member);
    int64_t agree = 0;
    for (int64_t s = 0; s < b; ++s) {
      const auto admitted = host_values(causal.stats[s * blocks + k].member);
      for (int64_t i = 0; i < t; ++i) agree += (member[s * t + i] > 0.5) == (admitted[i] > 0.5);
    }
    agreement.push_back(static_cast<double>(agree) / static_cast<double>(b * t));
  }
  return agreement;
}

}  // namespace mod::model
