// Shared command-line plumbing for the modtrain subcommands and the benchmarks: long options
// only, --help on each, errors that name the option, and a non-zero exit on bad input. The
// parsing and the config options live here once, in the modtrain_cli library.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

#include "configs/modtrain.pb.h"

namespace mod::cli {

namespace po = boost::program_options;

// Parses args into vm; returns false after printing help (unless print_help is false, e.g. on
// MPI ranks other than 0) when --help was given. Throws std::invalid_argument with the option
// named on bad or missing input. `positional`, where given, names the options that bare
// arguments fill.
bool parse(int argc, char** argv, const std::string& usage, po::options_description& options,
           po::variables_map& vm, const po::positional_options_description* positional = nullptr,
           bool print_help = true);

// --config FILE (required) and --set path.to.field=value (repeatable).
void add_config_options(po::options_description& o);
// --set alone, for programs whose --config differs (a default, several recipes).
void add_set_option(po::options_description& o,
                    const char* help = "override: path.to.field=value (repeatable)");
// The --set values in the order given (none without --set).
std::vector<std::string> overrides(const po::variables_map& vm);
// The --config file with the --set overrides applied (config::load).
modtrain::RunConfig load_config(const po::variables_map& vm);

int prep(int argc, char** argv);
int train(int argc, char** argv);
int eval(int argc, char** argv);
int sample(int argc, char** argv);
int inspect(int argc, char** argv);
int flops(int argc, char** argv);
int memory(int argc, char** argv);  // predicted peak memory per rank
int export_checkpoint(int argc, char** argv);  // `modtrain export` (export is a keyword)
int grid(int argc, char** argv);               // `modtrain grid plan|run|submit|collect`

}  // namespace mod::cli
