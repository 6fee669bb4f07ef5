// Option parsing shared by the subcommands and the benchmarks (cli.h).
#include "launcher/cli.h"

#include <iostream>
#include <stdexcept>

#include "configs/config.h"

namespace mod::cli {

bool parse(int argc, char** argv, const std::string& usage, po::options_description& options,
           po::variables_map& vm, const po::positional_options_description* positional,
           bool print_help) {
  options.add_options()("help", "show this help");
  try {
    po::command_line_parser parser(argc, argv);
    parser.options(options).style(po::command_line_style::unix_style ^
                                  po::command_line_style::allow_short);
    if (positional) parser.positional(*positional);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      if (print_help) std::cout << usage << "\n" << options << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw std::invalid_argument(std::string(e.what()) + " (see --help)");
  }
  return true;
}

void add_config_options(po::options_description& o) {
  o.add_options()("config", po::value<std::string>()->required(),
                  "text-format RunConfig, e.g. configs/recipes/tiny_mod.textproto");
  add_set_option(o);
}

void add_set_option(po::options_description& o, const char* help) {
  o.add_options()("set", po::value<std::vector<std::string>>()->composing(), help);
}

std::vector<std::string> overrides(const po::variables_map& vm) {
  return vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>{};
}

modtrain::RunConfig load_config(const po::variables_map& vm) {
  return config::load(vm["config"].as<std::string>(), overrides(vm));
}

}  // namespace mod::cli
