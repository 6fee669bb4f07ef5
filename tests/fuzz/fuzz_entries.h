// One entry per file reader, shared by the libFuzzer targets (fuzz_<target>.cpp, MOD_FUZZ build)
// and the corpus replay test (replay_test.cpp, every build). Invariant: an entry returns 0 or
// throws a std::exception for any input; a crash, hang, leak or huge allocation is a reader bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mod::fuzz {

using Entry = int (*)(const uint8_t* data, size_t size);

int fuzz_one_config(const uint8_t* data, size_t size);            // RunConfig text format
int fuzz_one_grid_spec(const uint8_t* data, size_t size);         // GridSpec text format
int fuzz_one_tokenizer(const uint8_t* data, size_t size);         // modtrain-tokenizer file
int fuzz_one_hf_tokenizer(const uint8_t* data, size_t size);      // tokenizer.json
int fuzz_one_token_shard(const uint8_t* data, size_t size);       // format byte + token file
int fuzz_one_checkpoint_meta(const uint8_t* data, size_t size);   // metadata.pb
int fuzz_one_checkpoint_shard(const uint8_t* data, size_t size);  // piece record + shard file
int fuzz_one_safetensors(const uint8_t* data, size_t size);       // .safetensors file
int fuzz_one_metrics_csv(const uint8_t* data, size_t size);       // metrics.csv on resume
int fuzz_one_tb_events(const uint8_t* data, size_t size);         // TensorBoard event file
int fuzz_one_dataset_manifest(const uint8_t* data, size_t size);  // dataset.textproto
int fuzz_one_prep_state(const uint8_t* data, size_t size);        // byte 0 (reseal?) + prep.state
int fuzz_one_text_source(const uint8_t* data, size_t size);       // 2 bytes (kind, chunk) + input

// Whether an error message names the input: the entries call it fuzz...; readers that take a
// path see /proc/self/fd/N. An error that names neither is a finding like a crash.
bool names_input(const std::string& what);

struct Target {
  const char* name;  // directory under tests/fuzz/corpus/ and regressions/
  Entry entry;
};
const std::vector<Target>& targets();

}  // namespace mod::fuzz
