// A pipeline stage's step (see pipeline_runtime.h).
#include "parallel/pipeline_runtime.h"

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/all_ops.h"
#include "core/autograd.h"

namespace mod::parallel {

namespace {
// Tags keep activations and gradients on separate channels between two ranks (MPI matches
// messages of one tag in order; the schedule sends each channel in its receiver's order).
constexpr int kActivationTag = 52, kGradTag = 53;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

StageStep run_stage_step(const model::Transformer& model, const PipelineSchedule& s,
                         const PipelinePartition& part, Communicator& pp,
                         const std::vector<PipelineMicroBatch>& mbs,
                         const LeafGradReady& last_backward_ready) {
  const int r = pp.rank(), m = static_cast<int>(mbs.size());
  if (s.virtual_stages != 1 || part.virtual_stages != 1)
    throw std::invalid_argument("pipeline runtime: one model chunk per rank (interleaved "
                                "schedules are simulated only)");
  if (pp.size() != s.pp || part.pp != s.pp || m != s.microbatches)
    throw std::invalid_argument("pipeline runtime: pp group of " + std::to_string(pp.size()) +
                                ", schedule for pp " + std::to_string(s.pp) + " and " +
                                std::to_string(s.microbatches) + " micro-batches, partition for pp " +
                                std::to_string(part.pp) + ", " + std::to_string(m) + " micro-batches given");
  const size_t first = part.first_block(r), end = first + part.blocks[r];
  const bool last = end == model.num_blocks();
  const int64_t b = mbs.at(0).tokens.size(0), t = mbs.at(0).tokens.size(1);
  const int64_t d = model.config().d_model();
  const Device device = mbs.at(0).tokens.device();

  StageStep out;
  out.results.resize(m);
  std::vector<Tensor> inputs(m), grads(m);
  std::vector<std::unique_ptr<Work>> sends;
  for (const PipeAction& a : s.ranks.at(r)) {
    const int i = a.microbatch;
    model::ForwardResult& res = out.results[i];
    const auto t0 = Clock::now();
    switch (a.op) {
      case PipeOp::RecvActivation:
        inputs[i] = Tensor::empty({b, t, d}, DType::F32, device);
        pp.recv(inputs[i], a.peer, kActivationTag);
        inputs[i].set_requires_grad(true);
        out.wait_s += seconds_since(t0);
        break;
      case PipeOp::Forward:
        res = model.forward_stage(mbs[i].tokens, inputs[i], first, end,
                                  last ? mbs[i].targets : Tensor());
        if (last) out.lm_loss += detach(res.lm_loss).to(DType::F64).item() / m;
        if (res.aux_loss.defined()) out.aux_loss += detach(res.aux_loss).to(DType::F64).item() / m;
        out.compute_s += seconds_since(t0);
        break;
      case PipeOp::SendActivation:
        sends.push_back(pp.send_async(res.hidden, a.peer, kActivationTag));
        break;
      case PipeOp::RecvGrad:
        grads[i] = Tensor::empty({b, t, d}, DType::F32, device);
        pp.recv(grads[i], a.peer, kGradTag);
        out.wait_s += seconds_since(t0);
        break;
      case PipeOp::Backward: {
        // The stage's own loss terms at 1/m, and the next stage's gradient into its output.
        // Downstream first, as one process's loss = lm_loss + aux_loss walks them.
        std::vector<Tensor> roots, seeds;
        if (!last) {
          roots.push_back(res.hidden);
          seeds.push_back(grads[i]);
        }
        if (res.loss.defined()) {
          roots.push_back(scale(res.loss, 1.0 / m));
          seeds.push_back(Tensor::full({}, 1.0, roots.back().dtype(), roots.back().device()));
        }
        backward(roots, seeds, i == m - 1 ? last_backward_ready : LeafGradReady());
        res.hidden = res.logits = res.loss = res.lm_loss = res.aux_loss = Tensor();
        grads[i] = Tensor();
        out.compute_s += seconds_since(t0);
        break;
      }
      case PipeOp::SendGrad:
        sends.push_back(pp.send_async(inputs[i].grad(), a.peer, kGradTag));
        inputs[i] = Tensor();
        break;
    }
  }
  // The step ends when the last stage does (the schedule's makespan): a stage done early (the
  // drain) waits for the others here, as it would in the trainer's next collective over pp.
  const auto t0 = Clock::now();
  for (auto& w : sends) w->wait();
  pp.barrier();
  out.wait_s += seconds_since(t0);
  return out;
}

std::unique_ptr<Communicator> make_tied_embedding_group(Communicator& pp) {
  const int r = pp.rank(), n = pp.size();
  const bool member = n > 1 && (r == 0 || r == n - 1);
  auto group = pp.split(member ? 0 : 1, r, "pp_embedding");
  return member ? std::move(group) : nullptr;
}

void sum_tied_embedding_grads(const model::Transformer& model, Communicator* group) {
  if (!group || !model.config().tie_embeddings()) return;
  for (const auto& [name, p] : model.named_parameters())
    if (name == "embed.weight") {
      Tensor g = p.grad();
      if (!g.defined()) throw std::logic_error("pipeline: embed.weight has no gradient on a tied stage");
      group->all_reduce(g);
    }
}

double pipeline_grad_norm(const model::Transformer& model, const PipelinePartition& part,
                          Communicator& pp) {
  const int r = pp.rank();
  double sq = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!stage_owns(part, r, name, /*tie_embeddings=*/false)) continue;  // tied: first stage's
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    const Tensor g64 = g.to(DType::F64).to(Device::CPU);
    for (int64_t i = 0; i < g64.numel(); ++i) sq += g64.data<double>()[i] * g64.data<double>()[i];
  }
  Tensor total = Tensor::from_vector(std::vector<double>{sq}, {1}, DType::F64);
  pp.all_reduce(total);
  return std::sqrt(total.at(0));
}

bool stage_owns(const PipelinePartition& part, int pp_rank, const std::string& name,
                bool tie_embeddings) {
  const int last = part.stages() - 1;
  if (name.rfind("blocks.", 0) == 0) return part.stage_of_block(std::stoi(name.substr(7))) == pp_rank;
  if (name.rfind("embed.", 0) == 0) return pp_rank == 0 || (tie_embeddings && pp_rank == last);
  return pp_rank == last;
}

}  // namespace mod::parallel
