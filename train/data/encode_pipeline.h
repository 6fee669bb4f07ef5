// Encoding on all cores, delivered in input order: one reader thread cuts a TextSource into
// batches of about batch_bytes of text, `threads` workers encode them, and the calling thread
// receives them in the order they were read. At most threads + 2 batches are in flight, so
// memory is bounded by a few batches, never by the corpus.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "train/data/text_source.h"
#include "train/data/tokenizer.h"

namespace mod::data {

struct EncodedBatch {
  std::vector<Document> docs;        // their text freed once encoded
  std::vector<uint32_t> tokens;      // every document's tokens (+ eot where eot_after), in order
  std::vector<size_t> ends;          // docs[k]'s tokens end at tokens[ends[k]]
  std::vector<size_t> text_bytes;    // docs[k]'s text size
};

// Runs the pipeline until the source ends, or until stop(batches read so far) says so between
// batches (the batches read are still delivered). Returns true when stopped early. The first
// exception of any thread (including consume's) is rethrown after every thread has ended.
bool encode_in_order(TextSource& source, const Tokenizer& tok, std::optional<uint32_t> eot,
                     unsigned threads, size_t batch_bytes,
                     const std::function<bool(uint64_t)>& stop,
                     const std::function<void(const EncodedBatch&)>& consume);

}  // namespace mod::data
