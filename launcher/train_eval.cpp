// modtrain train / eval / flops: configs in, a run directory or a table out.
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "configs/config.h"
#include "launcher/cli.h"
#include "model/flops.h"
#include "parallel/pipeline_partition.h"
#include "parallel/world.h"
#include "train/inference.h"
#include "train/stop_signal.h"
#include "train/test_hooks.h"
#include "train/trainer.h"

namespace mod::cli {

int train(int argc, char** argv) {
  po::options_description o("modtrain train options");
  add_config_options(o);
  o.add_options()("run-dir", po::value<std::string>()->required(), "output directory, e.g. runs/tiny_mod")
      ("data", po::value<std::string>(), "token shard directory (overrides data.dir)")
      ("rank-logs", po::value<std::string>(), "directory where ranks > 0 write rank_<r>.log (default: they print nothing)")
      ("resume", po::value<std::string>(), "auto (the run dir's latest checkpoint, if any) or a checkpoint/run directory")
      ("init-from", po::value<std::string>(), "start from the parameters of a safetensors file (modtrain export) or a Hugging Face Llama directory (config.json + safetensors; docs/hf.md)")
      ("rendezvous", po::value<std::string>()->default_value("auto"), "how the ranks meet: mpi, tcp (MASTER_ADDR:MASTER_PORT), file:DIR (shared storage) or auto (mpi under mpirun, tcp under torchrun-style RANK/WORLD_SIZE or srun --mpi=none); see docs/parallel.md");
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: [mpirun -np N] modtrain train --config FILE --run-dir DIR [--set f=v ...]\n"
             "weight decay (--set optimizer.decay_policy=...): MATRICES, the default, decays every\n"
             "  weight matrix (attn.*, mlp.*, MoE experts and routers, MoD's router.proj and\n"
             "  predictor.in/out weights, an untied lm_head); MATRICES_AND_EMBEDDING adds\n"
             "  embed.weight; ALL adds norms and biases (docs/training.md)",
             o, vm))
    return 0;
  modtrain::RunConfig cfg = load_config(vm);
  if (vm.count("data")) cfg.mutable_data()->set_dir(vm["data"].as<std::string>());
  if (cfg.train().device() != modtrain::TrainConfig::CUDA)
    parallel::require_mpi_world("train.device=CPU");  // before waiting for the other ranks
  const int rank = parallel::world().rank();
  bool quiet = rank != 0;
  if (rank != 0 && vm.count("rank-logs")) {
    const std::string dir = vm["rank-logs"].as<std::string>();
    std::filesystem::create_directories(dir);
    const std::string log = dir + "/rank_" + std::to_string(rank) + ".log";
    if (!std::freopen(log.c_str(), "w", stdout) || !std::freopen(log.c_str(), "a", stderr))
      throw std::runtime_error("--rank-logs: cannot write " + log);
    quiet = false;
  }
  std::string ignored_hooks;
  const train::TestHooks hooks = train::read_test_hooks(&ignored_hooks);
  if (rank == 0 && !ignored_hooks.empty()) std::fprintf(stderr, "%s\n", ignored_hooks.c_str());
  train::Trainer trainer(cfg, vm["run-dir"].as<std::string>(), quiet, parallel::world(), hooks);
  if (vm.count("init-from")) trainer.init_from(vm["init-from"].as<std::string>());
  if (vm.count("resume")) trainer.resume(vm["resume"].as<std::string>());
  trainer.run();
  return trainer.stopped() ? train::kExitCheckpointedStop : 0;
}

int eval(int argc, char** argv) {
  po::options_description o("modtrain eval options");
  o.add_options()("checkpoint", po::value<std::string>()->required(),
                  "weights file, checkpoint directory, or run directory (the newer of its "
                  "model.safetensors and latest checkpoint), e.g. runs/tiny_mod")
      ("data", po::value<std::string>(), "token shard directory (default: the run's data.dir)")
      ("batches", po::value<int64_t>()->default_value(16), "validation batches")
      ("batch-size", po::value<int64_t>()->default_value(8), "sequences per batch")
      ("json", po::bool_switch(), "print one JSON object instead of the table")
      ("allow-non-finite", po::bool_switch(), "open weights holding NaN or infinities (refused otherwise, naming the tensor)");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain eval --checkpoint FILE|DIR [--json]", o, vm)) return 0;
  const std::string data = vm.count("data") ? vm["data"].as<std::string>() : "";
  train::LoadChecks checks;
  checks.allow_non_finite = vm["allow-non-finite"].as<bool>();
  const auto r = train::evaluate_weights(vm["checkpoint"].as<std::string>(), data,
                                         vm["batches"].as<int64_t>(), vm["batch-size"].as<int64_t>(),
                                         checks);
  if (vm["json"].as<bool>()) {
    nlohmann::json j = {{"name", r.name},        {"step", r.step},     {"data_dir", r.data_dir},
                        {"tokens", r.tokens},    {"routed", r.routed}, {"top_c_loss", r.top_c_loss},
                        {"causal_loss", nullptr}};
    if (r.causal_loss) j["causal_loss"] = *r.causal_loss;
    if (!r.no_causal_loss.empty()) j["no_causal_loss"] = r.no_causal_loss;
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::fputs(train::eval_table(r).c_str(), stdout);
  return 0;
}

int flops(int argc, char** argv) {
  po::options_description o("modtrain flops options");
  add_config_options(o);
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain flops --config FILE [--set f=v ...]", o, vm)) return 0;
  const modtrain::RunConfig cfg = load_config(vm);
  std::printf("%s\n%s%s", cfg.name().c_str(), model::describe_flops(cfg.model()).c_str(),
              parallel::describe_pipeline(cfg).c_str());
  return 0;
}

}  // namespace mod::cli
