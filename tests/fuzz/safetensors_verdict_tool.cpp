// safetensors_verdict_tool: modtrain's verdict on safetensors files, for safetensors_oracle.py.
//   safetensors_verdict_tool FILE...   prints one line per file: "ok" or "refused <message>"
// Invariant: the verdict is load_safetensors's, the loader eval, sample and export use.
#include <cstdio>
#include <exception>
#include <string>

#include "core/util/safetensors.h"

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string line = "ok";
    try {
      mod::load_safetensors(argv[i]);
    } catch (const std::exception& e) {
      line = std::string("refused ") + e.what();
      for (char& c : line)
        if (c == '\n') c = ' ';
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}
