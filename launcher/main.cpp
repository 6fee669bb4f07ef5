// modtrain: one program, one subcommand per job (prep, train, eval, sample, inspect, flops, memory,
// export, grid).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "core/cpu/threads.h"
#include "launcher/cli.h"
#include "parallel/world.h"
#include "train/stop_signal.h"

namespace {
constexpr const char* kUsage =
    "usage: modtrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  prep    text, JSON Lines or gzip (or the KJV Bible) -> tokenizer + train/val token shards\n"
    "  train   train a dense or Mixture-of-Depths transformer from a config\n"
    "  eval    validation loss with top-C and with causal routing, side by side\n"
    "  sample  generate text with a KV cache (routed blocks admit tokens causally)\n"
    "  inspect where a trained model's routed blocks send the tokens of a text (PNG, HTML, CSV)\n"
    "  flops   parameters and FLOPs per token of a config\n"
    "  memory  predicted peak memory per rank of a config (parameters, optimizer, activations)\n"
    "  export  a checkpoint -> one safetensors file of the whole model\n"
    "  grid    isoFLOP grids: plan, run here, submit to Slurm, collect losses and plots\n"
    "\n"
    "`modtrain <command> --help` lists the command's options.\n";

// train's --rendezvous, read before the command parses its options: the world (MPI or the
// rendezvous) is set up before any command runs.
std::string bootstrap_option(int argc, char** argv) {
  const std::string flag = "--rendezvous";
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == flag && i + 1 < argc) return argv[i + 1];
    if (arg.rfind(flag + "=", 0) == 0) return arg.substr(flag.size() + 1);
  }
  return "auto";
}
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  // The commands that compute run OpenMP: its waiting threads sleep unless the user chose
  // otherwise, set before libgomp loads, so this may re-execute the program (core/cpu/threads.h).
  const bool computes = command == "train" || command == "eval" || command == "sample" ||
                        command == "inspect";
  if (computes) mod::cpu::reexec_with_openmp_defaults(argv);
  const auto run = [&]() -> int {
    if (command == "prep") return mod::cli::prep(argc - 1, argv + 1);
    if (command == "train") return mod::cli::train(argc - 1, argv + 1);
    if (command == "eval") return mod::cli::eval(argc - 1, argv + 1);
    if (command == "sample") return mod::cli::sample(argc - 1, argv + 1);
    if (command == "inspect") return mod::cli::inspect(argc - 1, argv + 1);
    if (command == "flops") return mod::cli::flops(argc - 1, argv + 1);
    if (command == "memory") return mod::cli::memory(argc - 1, argv + 1);
    if (command == "export") return mod::cli::export_checkpoint(argc - 1, argv + 1);
    if (command == "grid") return mod::cli::grid(argc - 1, argv + 1);
    std::fprintf(stderr, "modtrain: unknown command '%s'\n\n%s", command.c_str(), kUsage);
    return 2;
  };
  // Before any thread starts (MPI's, OpenMP's), so that all of them inherit the block and no
  // compute thread is interrupted by a stop signal (stop_signal.h); and before anything slow:
  // Slurm's USR1 lead can arrive during start-up, and the trainer checks after its first step.
  if (command == "train") mod::train::install_stop_handlers();
  if (command == "prep") mod::train::install_stop_handlers(/*with_sigint=*/true);
  // Under mpirun, srun or torchrun every rank runs this; a world of one otherwise.
  try {
    mod::parallel::init_world(&argc, &argv,
                              command == "train" ? bootstrap_option(argc, argv) : "auto");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "modtrain %s: error: %s\n", command.c_str(), e.what());
    return 2;
  }
  int code = 1;
  try {
    if (computes) {
      const std::string line =
          mod::cpu::configure_openmp_threads(mod::parallel::launch_info().local_size);
      // train's start-up lines go to stdout; eval --json owns its stdout.
      if (mod::parallel::launch_info().rank == 0)
        std::fprintf(command == "train" ? stdout : stderr, "%s\n", line.c_str());
    }
    code = run();
  } catch (const std::exception& e) {
    const std::string message = "modtrain " + command + ": error: " + e.what();
    // One failing rank must not leave the others waiting in a collective: end the whole job.
    if (mod::parallel::world_joined()) mod::parallel::world().abort(message, 1);
    std::fprintf(stderr, "%s\n", message.c_str());
    return 1;
  }
  mod::parallel::finalize_world();
  return code;
}
