// Option parsing shared by the subcommands.
#include "launcher/cli.h"

#include <iostream>
#include <stdexcept>

namespace mod::cli {

bool parse(int argc, char** argv, const std::string& usage, po::options_description& options,
           po::variables_map& vm) {
  options.add_options()("help", "show this help");
  try {
    po::store(po::command_line_parser(argc, argv)
                  .options(options)
                  .style(po::command_line_style::unix_style ^ po::command_line_style::allow_short)
                  .run(),
              vm);
    if (vm.count("help")) {
      std::cout << usage << "\n" << options << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw std::invalid_argument(std::string(e.what()) + " (see --help)");
  }
  return true;
}

}  // namespace mod::cli
