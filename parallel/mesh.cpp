// Mesh validation and the split of the world into dp, tp, ep, edp and pp groups (see mesh.h).
#include "parallel/mesh.h"

#include <stdexcept>
#include <string>

namespace mod::parallel {

namespace {
std::string s(int64_t v) { return std::to_string(v); }
}  // namespace

ParallelDims ParallelDims::from_config(const modtrain::ParallelConfig& cfg) {
  ParallelDims d{cfg.dp(), cfg.tp(), cfg.ep(), cfg.pp()};
  if (d.dp < 1 || d.tp < 1 || d.ep < 1 || d.pp < 1)
    throw std::invalid_argument("config: parallel.dp (" + s(d.dp) + "), parallel.tp (" + s(d.tp) +
                                "), parallel.ep (" + s(d.ep) + ") and parallel.pp (" + s(d.pp) +
                                ") must be >= 1");
  return d;
}

void ParallelDims::validate(int world_size) const {
  if (pp > 1 && dp * tp * pp != world_size)
    throw std::invalid_argument(
        "parallel layout: dp (" + s(dp) + ") x tp (" + s(tp) + ") x pp (" + s(pp) + ") = " +
        s(dp * tp * pp) + " does not equal the world size " + s(world_size) +
        " (the number of processes); set parallel.dp, parallel.tp and parallel.pp so that "
        "dp x tp x pp = " + s(world_size));
  if (pp == 1 && dp * tp != world_size)
    throw std::invalid_argument(
        "parallel layout: dp (" + s(dp) + ") x tp (" + s(tp) + ") = " + s(dp * tp) +
        " does not equal the world size " + s(world_size) +
        " (the number of processes); set parallel.dp and parallel.tp so that dp x tp = " +
        s(world_size));
  if (dp % ep != 0)
    throw std::invalid_argument("parallel layout: ep (" + s(ep) + ") must divide dp (" + s(dp) +
                                "): dp = " + s(dp) + " = ep x " + s(dp / ep) + " + " + s(dp % ep));
}

void ParallelDims::validate_model(const modtrain::ModelConfig& m) const {
  auto check = [&](int64_t value, const char* field) {
    if (value % tp != 0)
      throw std::invalid_argument("parallel layout: tp (" + s(tp) + ") must divide " + field +
                                  " (" + s(value) + "): " + s(value) + " = " + s(tp) + " x " +
                                  s(value / tp) + " + " + s(value % tp));
  };
  check(m.n_heads(), "model.n_heads");
  check(m.d_ff(), "model.d_ff");
  check(m.vocab_size(), "model.vocab_size");
  if (ep > 1 && !m.moe().enabled())
    throw std::invalid_argument("parallel layout: parallel.ep = " + s(ep) +
                                " needs model.moe.enabled (no experts to place)");
  const int64_t experts = m.moe().n_experts();
  if (m.moe().enabled() && experts % ep != 0)
    throw std::invalid_argument("parallel layout: parallel.ep (" + s(ep) +
                                ") must divide model.moe.n_experts (" + s(experts) +
                                "): " + s(experts) + " = " + s(ep) + " x " + s(experts / ep) +
                                " + " + s(experts % ep));
}

Mesh::Mesh(Communicator& world, ParallelDims dims) : world_(world), dims_(dims) {
  dims_.validate(world.size());
  // World rank = (stage x dp + dp_rank) x tp + tp_rank: each stage is a run of dp x tp ranks
  // laid out as without pp, and a pp group takes one rank of the same (dp, tp) from each stage.
  const int stage = world.rank() / (dims_.dp * dims_.tp), r = world.rank() % (dims_.dp * dims_.tp);
  const int dp_rank = r / dims_.tp, tp_rank = r % dims_.tp, stride = world.size();
  tp_ = world.split(stage * stride + dp_rank, tp_rank, "tp");
  dp_ = world.split(stage * stride + tp_rank, dp_rank, "dp");
  // ep: a run of ep consecutive dp ranks per tp rank; edp: every such run's rank dp_rank % ep.
  ep_ = world.split(stage * stride + (dp_rank / dims_.ep) * dims_.tp + tp_rank, dp_rank, "ep");
  edp_ = world.split(stage * stride + dp_rank % dims_.ep, r, "edp");
  pp_ = world.split(r, stage, "pp");
}

}  // namespace mod::parallel
