// prep.state: where a stopped `modtrain prep` resumes (see prep.h). A text file of lines
//   modtrain-prep-state 2 / option<TAB>name<TAB>value ... /
//   position INPUT OFFSET DOCUMENT LINE TAIL_CRC / documents N VAL TEXT_BYTES /
//   split I INDEX PARTIAL TOKENS DOCUMENTS / shard I NAME TOKENS CRC / end / crc32c HEX
// written atomically. Invariant: nothing in it is trusted as written. The last line seals every
// byte before it (CRC-32C, like a checkpoint's metadata), so a truncated or edited file is
// refused; check_prep_state then holds its counts, shard names and position against each other,
// the options and the inputs, and prep re-reads every finished shard before resuming.
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
  uint32_t next_tail_crc = 0;  // input_tail_crc at `next` (0 for an input that is not seekable)
  uint64_t documents = 0, val_documents = 0, text_bytes = 0;
  struct Split {
    uint64_t index = 0, partial = 0, tokens = 0, documents = 0;
    std::vector<ShardRecord> done;
  } split[2];
};

inline constexpr const char* kSplitNames[2] = {"train", "val"};

// "train_000003.bin": a split's shard `index`, the only names a prep writes.
std::string prep_shard_name(int split, uint64_t index);

// The state's text, sealed.
std::string prep_state_text(const PrepState& s);
// Parses and unseals a state file's text; errors name `where` (the file) and the line.
PrepState parse_prep_state(const std::string& text, const std::string& where);
// read_file + parse_prep_state.
PrepState read_prep_state(const std::string& path);

// The state held against itself and the options: shards named train_NNNNNN.bin / val_... in
// order, each finished one shard_tokens long, token and document counts that add up, a
// position inside the inputs (and at a seekable input, after the same bytes as when recorded).
// Errors name `where` and the field.
void check_prep_state(const PrepState& s, const std::vector<InputInfo>& inputs,
                      uint64_t shard_tokens, const std::string& where);

// "what changed" between a recorded fingerprint and this run's, or "" when they agree.
std::string fingerprint_change(const Fingerprint& was, const Fingerprint& now);

}  // namespace mod::data
