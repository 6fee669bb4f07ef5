// A shard read leaves nothing of the shard mapped: after windows read at random and both CRCs,
// the process's resident set holds none of the file's pages (/proc/self/smaps: the mapping's
// Rss is 0). Counting the pages a read maps by the bytes it asked for fails on kernels that map
// a whole large folio per fault (docs/data.md "Memory"); this checks the mapping itself.
#include <catch2/catch.hpp>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "train/data/token_file.h"

using namespace mod::data;
namespace fs = std::filesystem;

namespace {
struct Mapped {
  int64_t size_kib = 0, resident_kib = 0;  // of this process's mappings of one file
};
Mapped mapped(const std::string& path) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_file = false;
  Mapped m;
  while (std::getline(smaps, line)) {
    if (line.empty()) continue;
    // A mapping's header, "start-end perms offset dev inode [path]", starts with a lowercase
    // hex digit; its fields ("Rss:", "VmFlags:") with a capital.
    const bool header = (std::isdigit(static_cast<unsigned char>(line[0])) != 0 ||
                         (line[0] >= 'a' && line[0] <= 'f')) &&
                        line.find('-') < line.find(' ');
    if (header) {
      in_file = line.size() >= path.size() &&
                line.compare(line.size() - path.size(), path.size(), path) == 0;
    } else if (in_file && (line.rfind("Size:", 0) == 0 || line.rfind("Rss:", 0) == 0)) {
      int64_t n = 0;
      std::istringstream(line.substr(line.find(':') + 1)) >> n;
      (line[0] == 'S' ? m.size_kib : m.resident_kib) += n;
    }
  }
  return m;
}
}  // namespace

TEST_CASE("reading a shard leaves none of its pages mapped", "[data]") {
  const fs::path dir =
      fs::temp_directory_path() / ("modtrain_residency_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = fs::canonical(dir).string() + "/train_000000.bin";
  std::vector<uint32_t> tokens(4 << 20);  // 8 MiB of uint16 tokens, written: in the page cache
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = (i * 2654435761u) % 251;
  write_shard(path, tokens, 256);
  {
    const TokenFile f = TokenFile::open(path, modtrain::data::MODTRAIN, 256);
    std::vector<int64_t> window(257);
    for (uint64_t w = 0; w < 64; ++w) {
      const uint64_t begin = (w * 7919 * 257) % (f.tokens() - 257);
      f.read(begin, 257, window.data());
      CHECK(window[0] == static_cast<int64_t>(tokens[begin]));
    }
    REQUIRE(mapped(path).size_kib >= 8 << 10);  // the file is mapped (and found)
    CHECK(mapped(path).resident_kib == 0);
    f.sample_crc();
    f.full_crc();
    CHECK(mapped(path).resident_kib == 0);
  }
  fs::remove_all(dir);
}
