// Documents from text inputs for `modtrain prep`, read as a stream: the corpus is never held in
// memory, only a buffer of a few documents. Invariant: reading from a recorded Position yields
// exactly the documents that follow it in an uninterrupted read, so a prep can resume.
//
// Inputs, by name: "-" stdin (plain text), "kjv" Debian's `bible Gen1:1-Rev22:21`, *.jsonl,
// *.jsonl.gz, *.json.gz: one JSON object per line, the document is its string field text_field
// (blank lines skipped); other *.gz: gzip'd plain text; anything else: plain text.
// Plain text is cut into documents of about chunk_bytes: a document ends at the first line end
// at or after T bytes, or at 2T bytes inside a longer line; T = chunk_bytes for a stream of
// unknown size, and size / ceil(size / chunk_bytes) for a plain file, so a small file's
// documents are of nearly equal size (its last one is never a tiny tail).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mod::data {

enum class InputKind { PlainText, Jsonl, Stdin, Kjv };

struct InputInfo {
  std::string name;    // as given: a path, "-" or "kjv"
  InputKind kind = InputKind::PlainText;
  bool gzip = false;
  int64_t size = -1;   // bytes of the file (compressed for gzip); -1: unknown (stdin, kjv)
  bool seekable() const { return size >= 0 && !gzip; }
};

// Classifies name and stats it; throws "NAME: cannot open: ..." for a missing file.
InputInfo inspect_input(const std::string& name);

// CRC-32C of the up to 64 bytes of a seekable input just before offset (0 for another input):
// recorded with a resume point and compared on resume, so a moved position, or an input changed
// in place to the same size, is refused. Errors name the input.
uint32_t input_tail_crc(const InputInfo& in, uint64_t offset);

// Where the next document starts: within input `input`, at byte `offset` of a seekable input
// (plain or JSONL file), else after `document` documents of it (replayed by skipping).
struct Position {
  uint32_t input = 0;
  uint64_t offset = 0, document = 0, line = 0;  // line: lines read before offset (errors)
};

struct Document {
  std::string text;
  uint32_t input = 0;
  Position next;           // the position after this document
  bool eot_after = false;  // JSONL: every document; plain text: a file's last document
  bool last = false;       // the last document of all inputs
  uint64_t input_bytes = 0;  // bytes of the inputs read so far (compressed for gzip), progress
};

class TextSource {
 public:
  TextSource(std::vector<InputInfo> inputs, std::string text_field, size_t chunk_bytes);
  ~TextSource();
  // Starts reading at p (a fresh source starts at the beginning).
  void seek(const Position& p);
  // The next document, or false at the end of the inputs.
  bool next(Document& d);

 private:
  struct Reader;
  bool read_one(Document& d);  // without look-ahead
  void open_input(uint32_t i);

  std::vector<InputInfo> inputs_;
  std::string text_field_;
  size_t chunk_bytes_;
  uint64_t finished_bytes_ = 0;  // sizes of the inputs before the current one
  std::unique_ptr<Reader> reader_;
  Position pos_;
  Document ahead_;
  bool have_ahead_ = false, started_ = false;
};

}  // namespace mod::data
