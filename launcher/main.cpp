// modtrain: one program, one subcommand per job (prep, train, eval, sample, flops).
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "launcher/cli.h"

namespace {
constexpr const char* kUsage =
    "usage: modtrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  prep    text files (or the KJV Bible) -> tokenizer + train/val token shards\n"
    "  train   train a dense or Mixture-of-Depths transformer from a config\n"
    "  eval    validation loss with top-C and with causal routing, side by side\n"
    "  sample  generate text with a KV cache (routed blocks admit tokens causally)\n"
    "  flops   parameters and FLOPs per token of a config\n"
    "\n"
    "`modtrain <command> --help` lists the command's options.\n";
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  try {
    if (command == "prep") return mod::cli::prep(argc - 1, argv + 1);
    if (command == "train") return mod::cli::train(argc - 1, argv + 1);
    if (command == "eval") return mod::cli::eval(argc - 1, argv + 1);
    if (command == "sample") return mod::cli::sample(argc - 1, argv + 1);
    if (command == "flops") return mod::cli::flops(argc - 1, argv + 1);
    std::fprintf(stderr, "modtrain: unknown command '%s'\n\n%s", command.c_str(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "modtrain %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
