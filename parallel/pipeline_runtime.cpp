// A pipeline stage's step (see pipeline_runtime.h).
#include "parallel/pipeline_runtime.h"

#include <chrono>
#include <utility>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/optim.h"
#include "parallel/pipeline_issue_order.h"

namespace mod::parallel {

namespace {
// One MPI tag per link between virtual stages and direction: the activation virtual stage k
// sends to k + 1 and the gradient k + 1 sends back to k. With interleaving two ranks share
// several links (rank pp - 1 feeds rank 0's next chunk), so a receive matches its own link
// whatever the other links carry; within a link both sides go in micro-batch order.
constexpr int kLinkTagBase = 1000;  // apart from the statistics' tag (pipeline_training.cpp)
int link_tag(int upstream_stage, bool grad) { return kLinkTagBase + 2 * upstream_stage + (grad ? 1 : 0); }

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// What goes between stages: the residual stream as the model holds it between blocks, [B,T,D],
// or under sequence parallelism this tp rank's [B,T/tp,D] (Megatron sends the sharded stream:
// tp times fewer bytes than gathering it at the boundary, and nothing to re-split after).
Shape link_shape(const model::Transformer& model, int64_t b, int64_t t) {
  return {b, model.stream_length(t), model.config().d_model()};
}

// A micro-batch's results of the rank's chunks as one: statistics and choices in chunk order,
// which is block order (chunk c's blocks precede chunk c + 1's).
model::ForwardResult merge_chunks(std::vector<model::ForwardResult>& chunks) {
  model::ForwardResult out = std::move(chunks.front());
  for (size_t c = 1; c < chunks.size(); ++c) {
    model::ForwardResult& r = chunks[c];
    out.stats.insert(out.stats.end(), r.stats.begin(), r.stats.end());
    out.moe_stats.insert(out.moe_stats.end(), r.moe_stats.begin(), r.moe_stats.end());
    out.routed_idx.insert(out.routed_idx.end(), r.routed_idx.begin(), r.routed_idx.end());
  }
  return out;
}
}  // namespace

StageStep run_stage_step(const model::Transformer& model, const PipelineSchedule& s,
                         const PipelinePartition& part, Communicator& pp,
                         const std::vector<PipelineMicroBatch>& mbs,
                         const LeafGradReady& last_backward_ready,
                         const LeafGradReady& backward_ready) {
  const int r = pp.rank(), m = static_cast<int>(mbs.size()), v = s.virtual_stages;
  if (pp.size() != s.pp || part.pp != s.pp || part.virtual_stages != v || m != s.microbatches)
    throw std::invalid_argument(
        "pipeline runtime: pp group of " + std::to_string(pp.size()) + ", schedule for pp " +
        std::to_string(s.pp) + " x " + std::to_string(v) + " chunks and " +
        std::to_string(s.microbatches) + " micro-batches, partition for pp " +
        std::to_string(part.pp) + " x " + std::to_string(part.virtual_stages) + ", " +
        std::to_string(m) + " micro-batches given");
  const int last_stage = part.stages() - 1;
  const Shape link = link_shape(model, mbs.at(0).tokens.size(0), mbs.at(0).tokens.size(1));
  const Device device = mbs.at(0).tokens.device();
  Backend& be = backend(device);

  StageStep out;
  out.timed = device == Device::CPU;
  out.lm_loss = Tensor::zeros({}, DType::F64, device);
  out.aux_loss = Tensor::zeros({}, DType::F64, device);
  // Per micro-batch and chunk: its forward's result, received input and output gradient.
  std::vector<std::vector<model::ForwardResult>> res(m, std::vector<model::ForwardResult>(v));
  std::vector<std::vector<Tensor>> inputs(m, std::vector<Tensor>(v)), grads = inputs;
  std::vector<std::unique_ptr<Work>> sends;
  const std::vector<PipeAction>& actions = s.ranks.at(r);
  const std::vector<IssueStep> order = std::move(issue_order(s).at(r));
  for (const IssueStep& step : order) {
    const auto t0 = Clock::now();
    if (step.transfers) {
      // The round's sends and receives as one batch (one NCCL group), in schedule order.
      std::vector<PeerTransfer> batch;
      for (size_t k : step.actions) {
        const PipeAction& a = actions[k];
        const int i = a.microbatch, c = a.chunk, stage = s.virtual_stage(r, c);
        switch (a.op) {
          case PipeOp::RecvActivation:
            inputs[i][c] = Tensor::empty(link, DType::F32, device);
            batch.push_back({PeerTransfer::Recv, inputs[i][c], a.peer, link_tag(stage - 1, false)});
            break;
          case PipeOp::RecvGrad:
            grads[i][c] = Tensor::empty(link, DType::F32, device);
            batch.push_back({PeerTransfer::Recv, grads[i][c], a.peer, link_tag(stage, true)});
            break;
          case PipeOp::SendActivation:
            // Detached: the Work holds the bytes until the step ends, not the chunk's graph,
            // whose edges to the received input would keep that alive after the backward.
            batch.push_back(
                {PeerTransfer::Send, detach(res[i][c].hidden), a.peer, link_tag(stage, false)});
            break;
          case PipeOp::SendGrad:
            batch.push_back(
                {PeerTransfer::Send, inputs[i][c].grad(), a.peer, link_tag(stage - 1, true)});
            break;
          case PipeOp::Forward:
          case PipeOp::Backward:
            throw std::logic_error("pipeline runtime: compute action in a transfer round");
        }
      }
      sends.push_back(pp.send_recv(batch));
      for (size_t k : step.actions) {
        const PipeAction& a = actions[k];
        if (a.op == PipeOp::RecvActivation) inputs[a.microbatch][a.chunk].set_requires_grad(true);
        if (a.op == PipeOp::SendGrad) inputs[a.microbatch][a.chunk] = Tensor();  // the Work holds it
      }
      if (out.timed) out.wait_s += seconds_since(t0);
      continue;
    }
    const PipeAction& a = actions[step.actions.at(0)];
    const int i = a.microbatch, c = a.chunk, stage = s.virtual_stage(r, c);
    const bool last = stage == last_stage;
    model::ForwardResult& rs = res[i][c];
    if (a.op == PipeOp::Forward) {
      const size_t first = part.first_block(stage);
      rs = model.forward_stage(mbs[i].tokens, inputs[i][c], first, first + part.blocks[stage],
                               last ? mbs[i].targets : Tensor());
      // Added on the device, as one process's gradient accumulation adds its losses.
      if (last) be.axpy(1.0 / m, detach(rs.lm_loss).to(DType::F64), out.lm_loss);
      if (rs.aux_loss.defined()) be.axpy(1.0 / m, detach(rs.aux_loss).to(DType::F64), out.aux_loss);
    } else {
      // The chunk's own loss terms at 1/m, and the next stage's gradient into its output.
      // Downstream first, as one process's loss = lm_loss + aux_loss walks them.
      std::vector<Tensor> roots, seeds;
      if (!last) {
        roots.push_back(rs.hidden);
        seeds.push_back(grads[i][c]);
      }
      if (rs.loss.defined()) {
        roots.push_back(scale(rs.loss, 1.0 / m));
        seeds.push_back(Tensor::full({}, 1.0, roots.back().dtype(), roots.back().device()));
      }
      // A chunk's last backward (micro-batch m - 1) makes its gradients final.
      backward(roots, seeds, i == m - 1 ? last_backward_ready : backward_ready);
      rs.hidden = rs.logits = rs.loss = rs.lm_loss = rs.aux_loss = Tensor();
      grads[i][c] = Tensor();
    }
    if (out.timed) out.compute_s += seconds_since(t0);
  }
  // The step ends when the last stage does (the schedule's makespan): a stage done early (the
  // drain) waits for the others here, as it would in the trainer's next collective over pp.
  // On a GPU nothing here waits on the host: NCCL's sends are already ordered before later
  // work, and the host's clocks do not time the device.
  const auto t0 = Clock::now();
  for (auto& w : sends) w->wait();
  if (out.timed) {
    pp.barrier();
    out.wait_s += seconds_since(t0);
  }
  for (auto& chunks : res) out.results.push_back(merge_chunks(chunks));
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
  std::vector<Tensor> grads;
  for (const auto& [name, p] : model.named_parameters())
    if (stage_owns(part, r, name, /*tie_embeddings=*/false) && p.grad().defined())  // tied: first stage's
      grads.push_back(p.grad());
  const Device device = model.named_parameters().front().second.device();
  MultiTensorTable table;
  Tensor sq = grads.empty() ? Tensor::zeros({}, DType::F64, device)
                            : sum_squares_multi(grads, device, table);
  pp.all_reduce(sq);
  return std::sqrt(sq.item());
}

bool stage_owns(const PipelinePartition& part, int pp_rank, const std::string& name,
                bool tie_embeddings) {
  const int last_rank = part.rank_of(part.stages() - 1);
  if (name.rfind("blocks.", 0) == 0)
    return part.rank_of(part.stage_of_block(std::stoi(name.substr(7)))) == pp_rank;
  if (name.rfind("embed.", 0) == 0) return pp_rank == 0 || (tie_embeddings && pp_rank == last_rank);
  return pp_rank == last_rank;
}

}  // namespace mod::parallel
