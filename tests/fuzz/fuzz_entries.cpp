// The reader entries of fuzz_entries.h. Readers that take a path get the input through a memfd
// (/proc/self/fd/N), so they run their real open/stat/mmap code on exactly these bytes.
#include "tests/fuzz/fuzz_entries.h"

#include <google/protobuf/text_format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "configs/config.h"
#include "core/util/crc32c.h"
#include "core/util/safetensors_header.h"
#include "grid/spec.h"
#include "train/checkpoint/metadata.h"
#include "train/data/dataset.h"
#include "train/data/hf_tokenizer.h"
#include "train/data/prep_state.h"
#include "train/data/text_source.h"
#include "train/data/token_file.h"
#include "train/data/tokenizer.h"
#include "train/metrics/metrics_writer.h"
#include "train/weights_header.h"

namespace mod::fuzz {

namespace {

std::string text_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// An anonymous in-memory file holding the bytes; closed when it goes out of scope.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = ::memfd_create("mod_fuzz", MFD_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error("fuzz: memfd_create failed");
    for (size_t done = 0; done < size;) {
      const ssize_t w = ::write(fd_, data + done, size - done);
      if (w <= 0) throw std::runtime_error("fuzz: memfd write failed");
      done += static_cast<size_t>(w);
    }
  }
  ~MemFile() { ::close(fd_); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_ = -1;
};

}  // namespace

int fuzz_one_config(const uint8_t* data, size_t size) {
  const modtrain::RunConfig cfg = config::parse_text(text_of(data, size), "fuzz.textproto");
  config::validate_from(cfg, "fuzz.textproto");
  config::parse_checked(config::to_text(cfg), "fuzz.textproto (printed)");  // round trip
  return 0;
}

int fuzz_one_grid_spec(const uint8_t* data, size_t size) {
  const modtrain::GridSpec spec = grid::parse_grid_text(text_of(data, size), "fuzz.textproto");
  grid::validate_grid(spec, "fuzz.textproto");
  return 0;
}

// A loaded tokenizer also encodes a fixed text and the input's own bytes (long runs, odd
// bytes): a load that leaves encode unable to run is a finding, as a crash at load is.
int fuzz_one_tokenizer(const uint8_t* data, size_t size) {
  const std::string input = text_of(data, size);
  const auto tok = data::Tokenizer::parse_text(input, "fuzz.tokenizer");
  for (const std::string& text : {std::string("Hello, world! 1234 \xe2\x82\xac"), input})
    if (tok->decode(tok->encode(text)) != text) std::abort();  // a loaded tokenizer is lossless
  return 0;
}

int fuzz_one_hf_tokenizer(const uint8_t* data, size_t size) {
  const std::string input = text_of(data, size);
  const data::HfTokenizer tok(input, "fuzz.json");
  for (const std::string& text : {std::string("Hello, world! 1234 <|endoftext|>"), input})
    tok.decode(tok.encode(text));  // not compared: a normalizer may change the text
  return 0;
}

// Byte 0 picks the format and the vocabulary the caller passes (0, 256, 50257, 65536 or 70000).
int fuzz_one_token_shard(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static constexpr data::TokenFormat kFormats[] = {modtrain::data::MODTRAIN, modtrain::data::LLMC,
                                                   modtrain::data::NANOGPT};
  static constexpr uint32_t kVocabs[] = {0, 256, 50257, 65536, 70000};
  const data::TokenFormat format = kFormats[data[0] % 3];
  const uint32_t vocab = kVocabs[(data[0] / 3) % 5];
  const MemFile file(data + 1, size - 1);
  const data::TokenFile f = data::TokenFile::open(file.path(), format, vocab);
  std::vector<int64_t> window(4096);
  for (uint64_t begin = 0; begin < f.tokens(); begin += window.size())
    f.read(begin, std::min<uint64_t>(window.size(), f.tokens() - begin), window.data());
  f.sample_crc();
  return 0;
}

// The manifest is checked as a whole (versions, vocabulary, shard entries) before any shard it
// names is opened; a read manifest prints back to text that reads again.
int fuzz_one_dataset_manifest(const uint8_t* data, size_t size) {
  const MemFile file(data, size);
  const modtrain::data::Manifest m = data::read_manifest(file.path());
  std::string text;
  google::protobuf::TextFormat::PrintToString(m, &text);
  const MemFile again(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  data::read_manifest(again.path());
  return 0;
}

int fuzz_one_checkpoint_meta(const uint8_t* data, size_t size) {
  const auto meta = ckpt::open_meta(text_of(data, size), "checkpoint fuzz/metadata.pb");
  ckpt::state_from_meta(meta);
  return 0;
}

// Bytes 0-1: n, the length of a serialized Piece; byte 2: the dtype; then the Piece; then the
// shard file. Mirrors read_piece (shard_file.cpp) without allocating a tensor.
int fuzz_one_checkpoint_shard(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const size_t n = std::min<size_t>(size - 3, data[0] | data[1] << 8);
  static constexpr DType kDtypes[] = {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16};
  const DType dtype = kDtypes[data[2] % 5];
  modtrain::ckpt::Piece piece;
  if (!piece.ParseFromArray(data + 3, static_cast<int>(n))) return 0;
  const uint8_t* file = data + 3 + n;
  const uint64_t file_bytes = size - 3 - n;
  const std::string where = "checkpoint fuzz/shard_0.bin: tensor t: ";
  unsigned char header[64] = {};
  std::copy(file, file + std::min<uint64_t>(64, file_bytes), header);
  ckpt::check_shard_header(header, file_bytes, where);
  ckpt::check_piece_range(piece, dtype, file_bytes, where);
  if (crc32c(file + piece.byte_offset(), piece.byte_length()) != piece.crc32c())
    throw std::runtime_error(where + "CRC32C mismatch");
  return 0;
}

int fuzz_one_safetensors(const uint8_t* data, size_t size) {
  unsigned char first8[8] = {};
  std::copy(data, data + std::min<size_t>(8, size), first8);
  const uint64_t n = safetensors_header_length(first8, size, "fuzz.safetensors");
  const SafetensorsIndex index =
      parse_safetensors_header(text_of(data + 8, n), size, "fuzz.safetensors");
  for (const SafetensorsEntry& e : index.tensors) {  // the bytes a load would copy, and the seal
    crc32c(data + index.data_start + e.begin, e.end - e.begin);
    check_safetensors_seal(e, data + index.data_start + e.begin, "fuzz.safetensors");
  }
  // A modtrain weights file: the header checks load_weights makes, and the step a run
  // directory's reader (weights_step) takes from the same header, which must agree.
  const MemFile file(data, size);
  const int64_t step = train::weights_step(file.path());
  const auto format = index.metadata.find("format");
  if (format == index.metadata.end() || format->second != train::kWeightsFormat) return 0;
  if (train::check_weights_header(index, "fuzz.safetensors").step != step) std::abort();
  return 0;
}

// Byte 0: the checkpoint step to keep up to (0-255); the rest is metrics.csv.
int fuzz_one_metrics_csv(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  metrics::CsvWriter::kept_rows(text_of(data + 1, size - 1), data[0], "fuzz/metrics.csv");
  return 0;
}

// Byte 0: the checkpoint step to keep up to (0-255); the rest is an event file.
int fuzz_one_tb_events(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  metrics::TensorBoardWriter::kept_records(text_of(data + 1, size - 1), data[0],
                                           "fuzz/events.out.tfevents");
  return 0;
}

// Byte 0 odd: the rest is resealed first (a correct crc32c line appended), so the fuzzer reaches
// the line parser and check_prep_state behind the seal; even: the rest as it is. The state is
// checked against one seekable input (the rest's bytes) and --shard-tokens 400, and a state
// that passes must print and parse back to itself.
int fuzz_one_prep_state(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text = text_of(data + 1, size - 1);
  if (data[0] & 1) {
    char seal[32];
    std::snprintf(seal, sizeof seal, "crc32c %08x\n", crc32c(text.data(), text.size()));
    text += seal;
  }
  const data::PrepState s = data::parse_prep_state(text, "fuzz.prep.state");
  const std::string printed = data::prep_state_text(s);
  if (data::prep_state_text(data::parse_prep_state(printed, "fuzz.prep.state (printed)")) !=
      printed)
    std::abort();  // a state must survive its own round trip
  const MemFile input(data + 1, size - 1);
  data::InputInfo in;
  in.name = input.path();
  in.size = static_cast<int64_t>(size - 1);
  data::check_prep_state(s, {in}, 400, "fuzz.prep.state");
  return 0;
}

// Byte 0: the input's kind (plain text, JSON Lines, either gzip'd); byte 1: the chunk size of
// plain text (1 to 256 bytes) and a document to resume after. Every document is read; a plain
// file's documents give the file back; resuming after any document yields the same rest.
int fuzz_one_text_source(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const MemFile file(data + 2, size - 2);
  data::InputInfo in;
  in.name = file.path();
  in.kind = data[0] & 1 ? data::InputKind::Jsonl : data::InputKind::PlainText;
  in.gzip = data[0] & 2;
  in.size = static_cast<int64_t>(size - 2);
  const size_t chunk = 1 + data[1];
  std::vector<data::Document> docs;
  data::TextSource src({in}, "text", chunk);
  for (data::Document d; src.next(d);) {
    docs.push_back(d);
    if (docs.size() > size + 1) std::abort();  // every document consumes input
  }
  if (in.kind == data::InputKind::PlainText && !in.gzip) {
    std::string all;
    for (const auto& d : docs) all += d.text;
    if (all != text_of(data + 2, size - 2)) std::abort();
  }
  if (docs.empty()) return 0;
  const size_t k = data[1] % docs.size();
  data::TextSource rest({in}, "text", chunk);
  rest.seek(docs[k].next);
  data::Document d;
  for (size_t i = k + 1; i < docs.size(); ++i)
    if (!rest.next(d) || d.text != docs[i].text) std::abort();
  if (rest.next(d)) std::abort();
  return 0;
}

bool names_input(const std::string& what) {
  return what.find("fuzz") != std::string::npos || what.find("/proc/self/fd/") != std::string::npos;
}

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {
      {"config", fuzz_one_config},
      {"grid_spec", fuzz_one_grid_spec},
      {"tokenizer", fuzz_one_tokenizer},
      {"hf_tokenizer", fuzz_one_hf_tokenizer},
      {"token_shard", fuzz_one_token_shard},
      {"checkpoint_meta", fuzz_one_checkpoint_meta},
      {"checkpoint_shard", fuzz_one_checkpoint_shard},
      {"safetensors", fuzz_one_safetensors},
      {"metrics_csv", fuzz_one_metrics_csv},
      {"tb_events", fuzz_one_tb_events},
      {"dataset_manifest", fuzz_one_dataset_manifest},
      {"prep_state", fuzz_one_prep_state},
      {"text_source", fuzz_one_text_source},
  };
  return all;
}

}  // namespace mod::fuzz
