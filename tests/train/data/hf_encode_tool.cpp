// hf_encode_tool: a command-line view of a tokenizer for tests/train/data/hf_parity.py.
//   hf_encode_tool TOKENIZER TEXT_FILE           prints the ids of the file's bytes, one line
//   hf_encode_tool TOKENIZER IDS_FILE --decode   writes the bytes of whitespace-separated ids
//   hf_encode_tool TOKENIZER TEXT_FILE --bench N encodes N times on one thread, prints MB/s
// Invariant: stdout carries only the result, so the caller can compare it byte for byte.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "train/data/tokenizer.h"

namespace {
std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(std::string(path) + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: hf_encode_tool TOKENIZER FILE [--decode | --bench N]\n";
    return 2;
  }
  try {
    auto tok = mod::data::Tokenizer::load(argv[1]);
    const std::string input = read_file(argv[2]);
    const std::string mode = argc > 3 ? argv[3] : "";
    if (mode == "--decode") {
      std::istringstream in(input);
      std::vector<uint32_t> ids;
      for (uint32_t id; in >> id;) ids.push_back(id);
      const std::string bytes = tok->decode(ids);
      std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    } else if (mode == "--bench") {
      const int n = argc > 4 ? std::stoi(argv[4]) : 3;
      size_t tokens = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) tokens += tok->encode(input).size();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%.2f MB/s (%zu bytes x %d in %.3f s, %zu tokens per pass)\n",
                  input.size() * n / s / 1e6, input.size(), n, s, tokens / n);
    } else {
      std::string line;
      for (uint32_t id : tok->encode(input)) {
        if (!line.empty()) line += ' ';
        line += std::to_string(id);
      }
      std::printf("%s\n", line.c_str());
    }
  } catch (const std::exception& e) {
    std::cerr << "hf_encode_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
