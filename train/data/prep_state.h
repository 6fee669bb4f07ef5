// prep.state: where a stopped `modtrain prep` resumes (see prep.h). A text file of lines
//   modtrain-prep-state 1 / option<TAB>name<TAB>value ... / position INPUT OFFSET DOCUMENT LINE /
//   documents N VAL TEXT_BYTES / split I INDEX PARTIAL TOKENS DOCUMENTS / shard I NAME TOKENS CRC /
//   end
// written atomically; "end" last, so a file without it is refused as truncated.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/data/text_source.h"

namespace mod::data {

inline constexpr const char* kPrepStateName = "prep.state";

// The options and inputs that shape the output, as (name, value) pairs, so a rerun can say
// which one changed.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

struct ShardRecord {
  std::string name;
  uint64_t tokens = 0;
  uint32_t crc = 0;
};

struct PrepState {
  Fingerprint fingerprint;
  Position next;
  uint64_t documents = 0, val_documents = 0, text_bytes = 0;
  struct Split {
    uint64_t index = 0, partial = 0, tokens = 0, documents = 0;
    std::vector<ShardRecord> done;
  } split[2];
};

std::string prep_state_text(const PrepState& s);
// Reads and checks a state file; errors name the file and line.
PrepState read_prep_state(const std::string& path);
// "what changed" between a recorded fingerprint and this run's, or "" when they agree.
std::string fingerprint_change(const Fingerprint& was, const Fingerprint& now);

}  // namespace mod::data
