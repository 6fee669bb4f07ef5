// Shared command-line plumbing for the modtrain subcommands: long options only, --help on each,
// errors that name the option, and a non-zero exit on bad input.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace mod::cli {

namespace po = boost::program_options;

// Parses args into vm; returns false after printing help when --help was given. Throws
// std::invalid_argument with the option named on bad or missing input.
bool parse(int argc, char** argv, const std::string& usage, po::options_description& options,
           po::variables_map& vm);

int prep(int argc, char** argv);
int train(int argc, char** argv);
int eval(int argc, char** argv);
int sample(int argc, char** argv);
int flops(int argc, char** argv);
int export_checkpoint(int argc, char** argv);  // `modtrain export` (export is a keyword)
int grid(int argc, char** argv);               // `modtrain grid plan|run|submit|collect`

}  // namespace mod::cli
