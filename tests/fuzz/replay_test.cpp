// Corpus replay: every file under tests/fuzz/corpus/<target>/ (real seeds) and
// tests/fuzz/regressions/<target>/ (inputs a fuzzer once crashed on) goes through that target's
// entry; each must return or throw a std::exception whose message names the input's origin.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/fuzz/fuzz_entries.h"

namespace fs = std::filesystem;

namespace {
std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {});
}

// A reader that allocates from an unchecked length fails here rather than paging the machine
// (address space, not resident memory; sanitizer builds reserve terabytes, so they skip it).
void bound_memory() {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__has_feature)
  rlimit limit{size_t{8} << 30, size_t{8} << 30};
  setrlimit(RLIMIT_AS, &limit);
#elif defined(__has_feature)
#if !__has_feature(address_sanitizer)
  rlimit limit{size_t{8} << 30, size_t{8} << 30};
  setrlimit(RLIMIT_AS, &limit);
#endif
#endif
}
}  // namespace

TEST_CASE("every fuzz corpus and regression input parses or fails with an error", "[inputs]") {
  bound_memory();
  const fs::path root = fs::path(MOD_SOURCE_DIR) / "tests" / "fuzz";
  size_t inputs = 0;
  for (const auto& target : mod::fuzz::targets()) {
    size_t seeds = 0;
    for (const char* kind : {"corpus", "regressions"}) {
      const fs::path dir = root / kind / target.name;
      if (!fs::is_directory(dir)) continue;
      for (const auto& entry : fs::directory_iterator(dir)) {
        if (!entry.is_regular_file()) continue;
        const std::vector<uint8_t> bytes = read_bytes(entry.path());
        INFO(target.name << ": " << entry.path().string());
        try {
          target.entry(bytes.data(), bytes.size());
        } catch (const std::bad_alloc&) {
          FAIL("allocated beyond the bound: a length field was trusted");
        } catch (const std::exception& e) {
          CHECK(mod::fuzz::names_input(e.what()));
        }
        ++inputs;
        seeds += std::string(kind) == "corpus";
      }
    }
    INFO(target.name);
    CHECK(seeds > 0);  // every reader has real seed files
  }
  CHECK(inputs > 10);
}
