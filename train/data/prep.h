// Corpus preparation (`modtrain prep`, docs/data.md): text inputs streamed through a tokenizer on
// all cores into fixed-size token shards train_NNNNNN.bin / val_NNNNNN.bin and a manifest
// (dataset.textproto, written last). Invariant: the output depends only on the inputs and the
// options recorded in the manifest's PrepRecord -- not on threads, batches, or how often the
// prep was stopped and resumed -- so a resumed prep is byte-identical to an uninterrupted one.
//
// Split rule: documents are numbered i = 0, 1, ... over all inputs in order. With
// val_documents = N > 0, documents 0 .. N-1 are the validation split (llm.c's "first shard is
// val"); otherwise document i is held out when splitmix64(seed + i) / 2^64 < val_fraction. If
// that selects no document of the whole corpus, its last document is held out, so a tiny
// corpus can still be evaluated.
//
// Documents: each is followed by the tokenizer's end-of-text token (`<|endoftext|>` or --eot),
// when it has one (byte and BPE have none); documents cut from one plain-text file are
// contiguous text, so only that file's last document is followed by it.
//
// Resume: prep.state in the output directory records, atomically, the input position of the
// next document, the documents done and each split's finished shards and partial length; a
// rerun with the same options continues from it, one with other options or changed inputs is
// refused, naming the difference. A finished directory (manifest with the same PrepRecord) is
// skipped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mod::data {

struct PrepOptions {
  std::string out;                  // output directory
  std::vector<std::string> inputs;  // files ("-": stdin), read in order
  bool kjv = false;                 // the King James Bible (Debian's bible-kjv) before the inputs
  std::string tokenizer = "byte";   // byte, bpe, or a Hugging Face tokenizer.json
  uint32_t vocab_size = 4096;       // BPE vocabulary size (>= 256)
  uint64_t bpe_sample_mb = 256;     // BPE trains on the first this many MiB of training documents
  std::string eot;                  // end-of-text token; empty: "<|endoftext|>" if the tokenizer has it
  std::string text_field = "text";  // JSON Lines: the field holding a document
  uint64_t text_chunk_kb = 64;      // plain text: documents of about this many KiB
  double val_fraction = 0.05;       // held-out share of documents, in (0, 0.5]
  uint64_t val_documents = 0;       // or: the first this many documents (0: use val_fraction)
  uint64_t seed = 1;                // of the split
  uint64_t shard_tokens = 100000000;  // tokens per shard (the last of a split is shorter)
  unsigned threads = 0;             // encoding threads; 0: std::thread::hardware_concurrency()
  size_t batch_bytes = 1 << 20;     // text per encoding batch (a resume point between batches)
  bool progress = true;             // the progress line on stderr

  // Tests: stop as a signal would once this many batches are read (0: never). Otherwise a stop
  // is a received SIGTERM/SIGUSR1/SIGINT (train/stop_signal.h).
  size_t stop_after_batches = 0;
};

struct PrepSplit {
  uint64_t shards = 0, tokens = 0, documents = 0;
};

struct PrepResult {
  uint64_t text_bytes = 0, documents = 0;
  uint32_t vocab_size = 0;
  PrepSplit train, val;
  bool stopped = false;          // stopped by a signal (or stop_after_batches): resumable
  bool already_prepared = false;  // the directory held this prep already: nothing done
  bool resumed = false;           // continued from prep.state
  std::string manifest;           // the manifest's path
  double seconds = 0;
};

// Throws std::invalid_argument (naming the option) on bad options, std::runtime_error naming
// the file (and line) on unreadable or malformed input.
PrepResult prep(const PrepOptions& o);

// Existing llm.c or nanoGPT token files, indexed in place: out/dataset.textproto, and the
// tokenizer copied in as tokenizer.json (its `<|endoftext|>` id the eot_token) when given.
struct IndexOptions {
  std::string out, format;  // format: llmc or nanogpt
  std::vector<std::string> train_shards, val_shards;
  uint32_t vocab_size = 0;  // required for nanogpt; llm.c: 50257 when 0
  std::string tokenizer;    // optional tokenizer.json
};
std::string index_prep(const IndexOptions& o);  // returns the manifest's path

}  // namespace mod::data
