// Mesh validation and the split of the world into dp and tp groups (see mesh.h).
#include "parallel/mesh.h"

#include <stdexcept>
#include <string>

namespace mod::parallel {

namespace {
std::string s(int64_t v) { return std::to_string(v); }
}  // namespace

ParallelDims ParallelDims::from_config(const modtrain::ParallelConfig& cfg) {
  ParallelDims d{cfg.dp(), cfg.tp(), cfg.ep()};
  if (d.dp < 1 || d.tp < 1 || d.ep < 1)
    throw std::invalid_argument("config: parallel.dp (" + s(d.dp) + "), parallel.tp (" + s(d.tp) +
                                ") and parallel.ep (" + s(d.ep) + ") must be >= 1");
  return d;
}

void ParallelDims::validate(int world_size) const {
  if (dp * tp != world_size)
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
}

DeviceMesh::DeviceMesh(Communicator& world, ParallelDims dims) : world_(world), dims_(dims) {
  dims_.validate(world.size());
  const int r = world.rank();
  tp_ = world.split(r / dims_.tp, r % dims_.tp, "tp");
  dp_ = world.split(r % dims_.tp, r / dims_.tp, "dp");
}

}  // namespace mod::parallel
