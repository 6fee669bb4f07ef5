// libFuzzer target for the text_source reader (MOD_FUZZ build; scripts/fuzz.sh runs it). The entry
// lives in fuzz_entries.cpp so the ordinary test suite replays the same code on the corpus.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "tests/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    mod::fuzz::fuzz_one_text_source(data, size);
  } catch (const std::exception& e) {  // refused: fine when the error names the input
    if (!mod::fuzz::names_input(e.what())) {
      std::fprintf(stderr, "error naming neither file nor field: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
