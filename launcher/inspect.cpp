// modtrain inspect: where a trained MoD model's routed blocks send the tokens of a text, under
// top-C routing (training) and causal routing (sampling): a heat map, a page and a table.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "launcher/cli.h"
#include "train/inference.h"

namespace mod::cli {

int inspect(int argc, char** argv) {
  po::options_description o("modtrain inspect options");
  o.add_options()("checkpoint", po::value<std::string>()->required(),
                  "weights file, checkpoint directory, or run directory, e.g. runs/tiny_mod")(
      "text", po::value<std::string>(), "the text to route")("text-file", po::value<std::string>(),
                                                             "or a file holding it")(
      "out", po::value<std::string>()->default_value("inspect"),
      "output directory: routing.png, routing.html, routing.csv")(
      "tokenizer", po::value<std::string>(), "tokenizer file (default: the one of the run's dataset)")(
      "allow-non-finite", po::bool_switch(), "open weights holding NaN or infinities (refused otherwise, naming the tensor)");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain inspect --checkpoint FILE|DIR --text TEXT [--out DIR]", o,
             vm))
    return 0;
  if (vm.count("text") == vm.count("text-file"))
    throw std::invalid_argument("give one of --text and --text-file");
  train::InspectOptions io;
  io.weights = vm["checkpoint"].as<std::string>();
  io.out_dir = vm["out"].as<std::string>();
  if (vm.count("tokenizer")) io.tokenizer = vm["tokenizer"].as<std::string>();
  io.checks.allow_non_finite = vm["allow-non-finite"].as<bool>();
  if (vm.count("text")) {
    io.text = vm["text"].as<std::string>();
  } else {
    const std::string path = vm["text-file"].as<std::string>();
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::invalid_argument("--text-file " + path + ": cannot read it");
    std::stringstream ss;
    ss << f.rdbuf();
    io.text = ss.str();
  }
  const auto in = train::inspect_text(io);
  std::printf("%s\n", in.title.c_str());
  if (in.text_tokens > static_cast<int64_t>(in.trace.tokens.size()))
    std::printf("(the text has %lld tokens; the first %zu, model.seq_len, are routed)\n",
                static_cast<long long>(in.text_tokens), in.trace.tokens.size());
  std::printf("%s", train::describe_routing(in.trace, in.pieces).c_str());
  std::printf("wrote %s, %s", in.report.csv.c_str(), in.report.html.c_str());
  if (!in.report.png.empty())
    std::printf(", %s\n", in.report.png.c_str());
  else
    std::printf("\nrouting.png not drawn: %s\n", in.report.png_not_drawn.c_str());
  return 0;
}

}  // namespace mod::cli
