// modtrain prep: text, JSON Lines or gzip inputs -> token shards, tokenizer and dataset.textproto
// in --out (train/data/prep.h); or existing llm.c/nanoGPT token files indexed in place. A stop
// signal ends it resumably with exit code 75 (train/stop_signal.h), like modtrain train.
#include "train/data/prep.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "train/stop_signal.h"

namespace mod::cli {

namespace {
std::string split_line(const char* split, const data::PrepSplit& s) {
  char b[160];
  std::snprintf(b, sizeof b, "  %s: %" PRIu64 " shard%s (%s_000000.bin ..), %" PRIu64
                " tokens, %" PRIu64 " documents\n",
                split, s.shards, s.shards == 1 ? "" : "s", split, s.tokens, s.documents);
  return b;
}
}  // namespace

int prep(int argc, char** argv) {
  po::options_description o("modtrain prep options");
  o.add_options()
      ("out", po::value<std::string>()->required(), "output directory, e.g. data/kjv")
      ("input", po::value<std::vector<std::string>>()->multitoken(),
       "inputs in order: text files, *.jsonl, *.jsonl.gz, *.json.gz, other *.gz (gzip text); - is stdin")
      ("kjv", po::bool_switch(), "the King James Bible from Debian's bible-kjv package, first")
      ("tokenizer", po::value<std::string>()->default_value("byte"), "byte, bpe, or a Hugging Face tokenizer.json")
      ("vocab-size", po::value<uint32_t>(), "BPE vocabulary size (default 4096); with --format: the vocabulary")
      ("bpe-sample-mb", po::value<uint64_t>()->default_value(256), "BPE trains on the first this many MiB of training text")
      ("eot", po::value<std::string>(), "end-of-text token appended to every document (default <|endoftext|> when the tokenizer has it)")
      ("text-field", po::value<std::string>()->default_value("text"), "JSON Lines: the string field of a document")
      ("text-chunk-kb", po::value<uint64_t>()->default_value(64), "plain text: documents of about this many KiB, cut at line ends")
      ("val-fraction", po::value<double>()->default_value(0.05, "0.05"), "share of documents held out for validation, in (0, 0.5]")
      ("val-documents", po::value<uint64_t>()->default_value(0), "or: hold out the first this many documents")
      ("seed", po::value<uint64_t>()->default_value(1), "of the document split")
      ("shard-tokens", po::value<uint64_t>()->default_value(100000000), "tokens per shard")
      ("threads", po::value<unsigned>()->default_value(0), "encoding threads (0: all cores)")
      ("format", po::value<std::string>(), "index existing token files instead: llmc or nanogpt")
      ("train-shards", po::value<std::vector<std::string>>()->multitoken(), "with --format: training token files")
      ("val-shards", po::value<std::vector<std::string>>()->multitoken(), "with --format: validation token files");
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: modtrain prep --out DIR (--kjv | --input FILE...) [options]\n"
             "       modtrain prep --out DIR --format llmc|nanogpt --train-shards FILE... --val-shards FILE...",
             o, vm))
    return 0;
  const std::string out = vm["out"].as<std::string>();

  if (vm.count("format")) {
    data::IndexOptions x;
    x.out = out;
    x.format = vm["format"].as<std::string>();
    if (vm.count("train-shards")) x.train_shards = vm["train-shards"].as<std::vector<std::string>>();
    if (vm.count("val-shards")) x.val_shards = vm["val-shards"].as<std::vector<std::string>>();
    if (vm.count("vocab-size")) x.vocab_size = vm["vocab-size"].as<uint32_t>();
    if (vm["tokenizer"].as<std::string>() != "byte") x.tokenizer = vm["tokenizer"].as<std::string>();
    const std::string manifest = data::index_prep(x);
    std::printf("prep: indexed %zu training and %zu validation %s files in place\n  manifest: %s\n",
                x.train_shards.size(), x.val_shards.size(), x.format.c_str(), manifest.c_str());
    return 0;
  }
  if (vm.count("train-shards") || vm.count("val-shards"))
    throw std::invalid_argument("--train-shards/--val-shards: give --format llmc or nanogpt");

  data::PrepOptions p;
  p.out = out;
  if (vm.count("input")) p.inputs = vm["input"].as<std::vector<std::string>>();
  p.kjv = vm["kjv"].as<bool>();
  p.tokenizer = vm["tokenizer"].as<std::string>();
  if (vm.count("vocab-size")) p.vocab_size = vm["vocab-size"].as<uint32_t>();
  p.bpe_sample_mb = vm["bpe-sample-mb"].as<uint64_t>();
  if (vm.count("eot")) p.eot = vm["eot"].as<std::string>();
  p.text_field = vm["text-field"].as<std::string>();
  p.text_chunk_kb = vm["text-chunk-kb"].as<uint64_t>();
  p.val_fraction = vm["val-fraction"].as<double>();
  p.val_documents = vm["val-documents"].as<uint64_t>();
  p.seed = vm["seed"].as<uint64_t>();
  p.shard_tokens = vm["shard-tokens"].as<uint64_t>();
  p.threads = vm["threads"].as<unsigned>();
  const data::PrepResult r = data::prep(p);

  if (r.already_prepared) {
    std::printf("prep: %s is already prepared with these inputs and options (%s); nothing to do\n",
                out.c_str(), r.manifest.c_str());
    return 0;
  }
  if (r.stopped) {
    if (std::count(p.inputs.begin(), p.inputs.end(), "-")) {
      std::printf("prep: stopped by a signal after %" PRIu64 " documents; it read stdin, which "
                  "cannot be replayed, so it cannot resume (delete %s and start over)\n",
                  r.documents, out.c_str());
      return mod::train::kExitCheckpointedStop;
    }
    std::string command = "modtrain";
    for (int i = 0; i < argc; ++i) command += std::string(" ") + argv[i];
    std::printf("prep: stopped by a signal after %" PRIu64 " documents; the state is saved in %s/prep.state\n"
                "  resume: rerun the same command: %s\n",
                r.documents, out.c_str(), command.c_str());
    return mod::train::kExitCheckpointedStop;
  }
  std::printf("prep: %s: %" PRIu64 " documents, %" PRIu64 " bytes of text, %s tokenizer (vocab %u) "
              "in %.1fs%s\n%s%s  manifest: %s\n",
              out.c_str(), r.documents, r.text_bytes, p.tokenizer.c_str(), r.vocab_size, r.seconds,
              r.resumed ? " (resumed)" : "", split_line("train", r.train).c_str(),
              split_line("val", r.val).c_str(), r.manifest.c_str());
  return 0;
}

}  // namespace mod::cli
