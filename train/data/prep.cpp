// Streaming, parallel, resumable corpus preparation (see prep.h): inputs through the ordered
// encoding pipeline (encode_pipeline.h) into two shard streams, with a resume point (prep_state.h)
// recorded every few seconds and at every finished shard.
#include "train/data/prep.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "core/util/atomic_file.h"
#include "core/util/crc32c.h"
#include "train/data/dataset.h"
#include "train/data/encode_pipeline.h"
#include "train/data/prep_state.h"
#include "train/data/text_source.h"
#include "train/data/token_file.h"
#include "train/data/tokenizer.h"
#include "train/data/tokenizer_seal.h"
#include "train/stop_signal.h"

namespace mod::data {

namespace fs = std::filesystem;
namespace pb = modtrain::data;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::string fmt_double(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

void remove_split_files(const std::string& out, int split, uint64_t from_index) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    const std::string prefix = std::string(kSplitNames[split]) + "_";
    if (n.rfind(prefix, 0) != 0) continue;
    const size_t dot = n.find(".bin");
    if (dot == std::string::npos) continue;
    const std::string digits = n.substr(prefix.size(), dot - prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (std::stoull(digits) >= from_index) fs::remove(e.path());
  }
}

void validate(const PrepOptions& o) {
  if (o.out.empty()) throw std::invalid_argument("--out: missing");
  if (!(o.val_fraction > 0 && o.val_fraction <= 0.5))
    throw std::invalid_argument("--val-fraction " + fmt_double(o.val_fraction) + ": expected (0, 0.5]");
  if (o.shard_tokens == 0) throw std::invalid_argument("--shard-tokens 0: expected at least 1");
  if (o.text_chunk_kb == 0) throw std::invalid_argument("--text-chunk-kb 0: expected at least 1");
  if (o.bpe_sample_mb == 0) throw std::invalid_argument("--bpe-sample-mb 0: expected at least 1");
  if (o.text_field.empty()) throw std::invalid_argument("--text-field: empty");
  if (o.batch_bytes == 0) throw std::invalid_argument("batch_bytes: 0");
  const bool json = o.tokenizer.size() > 5 && o.tokenizer.ends_with(".json");
  if (o.tokenizer != "byte" && o.tokenizer != "bpe" && !json)
    throw std::invalid_argument("--tokenizer " + o.tokenizer +
                                ": expected byte, bpe or a tokenizer.json file");
  if (o.tokenizer == "bpe" && o.vocab_size <= 256)
    throw std::invalid_argument("--vocab-size " + std::to_string(o.vocab_size) +
                                ": expected more than 256 for bpe");
  if (!o.eot.empty() && !json)
    throw std::invalid_argument("--eot " + o.eot + ": the " + o.tokenizer +
                                " tokenizer has no special tokens (documents are not separated)");
  if (!o.kjv && o.inputs.empty()) throw std::invalid_argument("no text: give --kjv or --input FILE...");
  if (std::count(o.inputs.begin(), o.inputs.end(), "-") > 1)
    throw std::invalid_argument("--input -: stdin can be read once");
  if (o.tokenizer == "bpe" && std::count(o.inputs.begin(), o.inputs.end(), "-"))
    throw std::invalid_argument("--input -: BPE trains on a sample read before the encoding, and "
                                "stdin can be read once; save it to a file, or give --tokenizer "
                                "byte or a tokenizer.json");
}

// The split rule of prep.h, without its last-document fallback.
bool held_out(const PrepOptions& o, uint64_t document) {
  if (o.val_documents > 0) return document < o.val_documents;
  return splitmix64(o.seed + document) < static_cast<uint64_t>(o.val_fraction * 0x1p64);
}

// Training documents from the start of the corpus, up to limit bytes (BPE's sample).
std::string bpe_sample(const std::vector<InputInfo>& inputs, const PrepOptions& o, size_t chunk,
                       uint64_t limit) {
  TextSource src(inputs, o.text_field, chunk);
  std::string sample;
  Document d;
  for (uint64_t i = 0; sample.size() < limit && src.next(d); ++i) {
    if (held_out(o, i)) continue;
    sample.append(d.text, 0, std::min<size_t>(d.text.size(), limit - sample.size()));
    if (d.eot_after && sample.size() < limit) sample += '\n';
  }
  return sample;
}
// One output split: a sequence of shards of shard_tokens tokens, <split>_000000.bin, ...
class ShardStream {
 public:
  ShardStream(std::string out, int split, uint64_t shard_tokens, uint32_t vocab)
      : out_(std::move(out)), split_(split), shard_tokens_(shard_tokens), vocab_(vocab) {}

  // A recorded split's finished shards, re-read whole before anything is changed: each must
  // hold the header, token count and CRC-32C the state recorded.
  void check_finished(const PrepState::Split& r) const {
    const std::string start_over = " (delete " + out_ + " to start over)";
    for (const ShardRecord& d : r.done) {
      const std::string path = (fs::path(out_) / d.name).string();
      if (!fs::exists(path)) fail(path, "missing: the stopped prep cannot resume" + start_over);
      const TokenFile f = TokenFile::open(path, pb::MODTRAIN, vocab_);
      if (f.tokens() != d.tokens || f.full_crc() != d.crc)
        fail(path, std::to_string(f.tokens()) + " tokens, CRC-32C " + std::to_string(f.full_crc()) +
                       "; " + kPrepStateName + " recorded " + std::to_string(d.tokens) +
                       " tokens, " + std::to_string(d.crc) + ": changed since it was written" +
                       start_over);
    }
  }

  // Continues a recorded split (checked by check_prep_state and check_finished; its partial
  // shard cut back to the recorded length), or starts afresh (r null); either way removes the
  // split's shards past the current one.
  void restore(const PrepState::Split* r) {
    if (!r) {
      remove_split_files(out_, split_, 0);
      return;
    }
    index_ = r->index;
    done_ = r->done;
    tokens_ = r->tokens;
    documents_ = r->documents;
    remove_split_files(out_, split_, index_ + 1);
    const std::string path = current_path();
    if (r->partial > 0) {
      // Finished after the state was recorded: reopen it as the partial it was.
      if (!fs::exists(path + ".partial") && fs::exists(path)) fs::rename(path, path + ".partial");
      writer_ = std::make_unique<ShardWriter>(path, vocab_, r->partial);
    } else {
      fs::remove(path);
      fs::remove(path + ".partial");
    }
  }

  // Appends one document's n tokens; true when a shard was finished.
  bool append_document(const uint32_t* t, size_t n) {
    bool finished = false;
    while (n > 0) {
      if (!writer_) writer_ = std::make_unique<ShardWriter>(current_path(), vocab_);
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, shard_tokens_ - writer_->tokens()));
      writer_->append(t, take);
      t += take;
      n -= take;
      tokens_ += take;
      if (writer_->tokens() == shard_tokens_) {
        finish_shard();
        finished = true;
      }
    }
    ++documents_;
    return finished;
  }

  void finish() {  // the last, shorter shard
    if (writer_) finish_shard();
  }

  // The split's resume record; syncs its partial shard first.
  PrepState::Split record() const {
    if (writer_) writer_->sync();
    return {index_, partial(), tokens_, documents_, done_};
  }

  uint64_t partial() const { return writer_ ? writer_->tokens() : 0; }
  uint64_t tokens() const { return tokens_; }
  uint64_t documents() const { return documents_; }
  const std::vector<ShardRecord>& done() const { return done_; }

 private:
  std::string current_path() const {
    return (fs::path(out_) / prep_shard_name(split_, index_)).string();
  }
  void finish_shard() {
    const uint64_t n = writer_->tokens();
    const uint32_t crc = writer_->finish();
    done_.push_back({prep_shard_name(split_, index_), n, crc});
    writer_.reset();
    ++index_;
  }

  std::string out_;
  int split_;
  uint64_t shard_tokens_;
  uint32_t vocab_;
  uint64_t index_ = 0;  // the shard being written
  std::unique_ptr<ShardWriter> writer_;
  std::vector<ShardRecord> done_;
  uint64_t tokens_ = 0, documents_ = 0;
};

// The progress line: at most every 2 s on a terminal (\r), one line per 10 s otherwise; the
// rate counts from where this run started reading (a resumed prep skips what was done).
class Progress {
 public:
  Progress(bool enabled, int64_t total_bytes) : enabled_(enabled), total_bytes_(total_bytes) {}

  void batch(const EncodedBatch& b, const PrepState& st, const ShardStream (&streams)[2]) {
    if (!have_start_) {
      have_start_ = true;
      const Document& first = b.docs.front();
      start_bytes_ = first.input_bytes - std::min<uint64_t>(first.input_bytes, b.text_bytes.front());
    }
    cur_bytes_ = b.docs.back().input_bytes;
    if (enabled_ && std::chrono::duration<double>(Clock::now() - last_print_).count() >= every_) {
      print(st, streams, false);
      last_print_ = Clock::now();
    }
  }
  void end(const PrepState& st, const ShardStream (&streams)[2]) {
    if (enabled_ && printed_) print(st, streams, true);
  }

 private:
  void print(const PrepState& st, const ShardStream (&streams)[2], bool final_line) {
    const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    const double mb = cur_bytes_ / 1e6, rate = secs > 0 ? (cur_bytes_ - start_bytes_) / 1e6 / secs : 0;
    char eta[64] = "";
    if (total_bytes_ > 0 && rate > 0)
      std::snprintf(eta, sizeof eta, ", ETA %.0fs", std::max(0.0, (total_bytes_ / 1e6 - mb) / rate));
    char total[64] = "";
    if (total_bytes_ > 0) std::snprintf(total, sizeof total, " / %.1f", total_bytes_ / 1e6);
    std::fprintf(stderr, "%sprep: %.1f%s MB read, %.1f MB/s, %" PRIu64 " documents, %" PRIu64
                 " tokens, %" PRIu64 " shards%s%s",
                 tty_ ? "\r" : "", mb, total, rate, st.documents,
                 streams[0].tokens() + streams[1].tokens(),
                 static_cast<uint64_t>(streams[0].done().size() + streams[1].done().size()), eta,
                 tty_ && !final_line ? "" : "\n");
    std::fflush(stderr);
    printed_ = true;
  }

  bool enabled_;
  int64_t total_bytes_;
  bool tty_ = ::isatty(2);
  double every_ = tty_ ? 2.0 : 10.0;
  Clock::time_point start_ = Clock::now(), last_print_ = Clock::now();
  uint64_t start_bytes_ = 0, cur_bytes_ = 0;
  bool have_start_ = false, printed_ = false;
};

// "the inputs a.txt, b.jsonl" (the first three named), for errors about all of them.
std::string inputs_named(const std::vector<InputInfo>& inputs) {
  std::string s = inputs.size() == 1 ? "the input " : "the inputs ";
  for (size_t i = 0; i < inputs.size() && i < 3; ++i) s += (i ? ", " : "") + inputs[i].name;
  if (inputs.size() > 3) s += " and " + std::to_string(inputs.size() - 3) + " more";
  return s;
}

// The options and inputs that shape the output (a resume must see the same).
Fingerprint fingerprint_of(const PrepOptions& o, const std::vector<InputInfo>& inputs, bool json_tok) {
  Fingerprint fp;
  for (size_t i = 0; i < inputs.size(); ++i)
    fp.emplace_back("input " + std::to_string(i),
                    inputs[i].name + (inputs[i].size >= 0 ? " (" + std::to_string(inputs[i].size) + " bytes)" : ""));
  // Read through the tokenizer reader: a FIFO or device is refused here, by name.
  fp.emplace_back(
      "--tokenizer",
      o.tokenizer +
          (json_tok ? " (" + std::to_string(read_tokenizer_file(o.tokenizer).size()) + " bytes)"
                    : ""));
  if (o.tokenizer == "bpe") {
    fp.emplace_back("--vocab-size", std::to_string(o.vocab_size));
    fp.emplace_back("--bpe-sample-mb", std::to_string(o.bpe_sample_mb));
  }
  fp.emplace_back("--eot", o.eot);
  fp.emplace_back("--text-field", o.text_field);
  fp.emplace_back("--text-chunk-kb", std::to_string(o.text_chunk_kb));
  fp.emplace_back("--shard-tokens", std::to_string(o.shard_tokens));
  fp.emplace_back("--val-fraction", fmt_double(o.val_fraction));
  fp.emplace_back("--val-documents", std::to_string(o.val_documents));
  fp.emplace_back("--seed", std::to_string(o.seed));
  return fp;
}

pb::PrepRecord record_of(const PrepOptions& o, const std::vector<InputInfo>& inputs) {
  pb::PrepRecord record;
  for (const auto& i : inputs) record.add_inputs(i.name);
  record.set_tokenizer(o.tokenizer);
  record.set_shard_tokens(o.shard_tokens);
  record.set_val_fraction(o.val_documents > 0 ? 0 : o.val_fraction);
  record.set_val_documents(o.val_documents);
  record.set_seed(o.seed);
  return record;
}

// A finished directory: the same prep is skipped, another one refused.
PrepResult already_prepared(const PrepOptions& o, const std::string& manifest_path,
                            const pb::PrepRecord& record) {
  const pb::Manifest m = read_manifest(manifest_path);
  pb::PrepRecord was = m.prep();
  was.clear_documents();
  was.clear_text_bytes();
  if (was.SerializeAsString() != record.SerializeAsString() ||
      (o.tokenizer == "bpe" && m.vocab_size() != o.vocab_size))
    throw std::invalid_argument(
        o.out + " already holds a dataset prepared from other inputs or options (its manifest's "
                "prep record differs); use a new --out or delete it");
  fs::remove(fs::path(o.out) / kPrepStateName);
  PrepResult result;
  result.manifest = manifest_path;
  result.already_prepared = true;
  result.documents = m.prep().documents();
  result.text_bytes = m.prep().text_bytes();
  result.vocab_size = m.vocab_size();
  for (const auto& s : m.train()) ++result.train.shards, result.train.tokens += s.tokens();
  for (const auto& s : m.val()) ++result.val.shards, result.val.tokens += s.tokens();
  return result;
}

// The tokenizer, saved in the directory before any shard, so a resumed prep encodes with the
// same one (a BPE is not trained again).
struct PrepTokenizer {
  std::unique_ptr<Tokenizer> tok;
  std::string file;  // its name in the output directory
  uint32_t crc32c = 0;  // of the file as written there: the manifest's seal
  std::optional<uint32_t> eot;
};
// A tokenizer.json's end-of-text token: --eot, else <|endoftext|> if it has one.
PrepTokenizer with_eot(PrepTokenizer t, const PrepOptions& o) {
  t.eot = t.tok->special_token(o.eot.empty() ? "<|endoftext|>" : o.eot);
  if (!t.eot && !o.eot.empty())
    throw std::invalid_argument("--eot " + o.eot + ": not a special token of " + o.tokenizer);
  return t;
}

PrepTokenizer prep_tokenizer(const PrepOptions& o, const std::vector<InputInfo>& inputs,
                             bool json_tok, bool resuming) {
  PrepTokenizer t;
  t.file = json_tok ? "tokenizer.json" : "tokenizer.txt";
  const std::string path = (fs::path(o.out) / t.file).string();
  const bool saved = resuming && fs::exists(path);
  if (json_tok) {  // read once: the bytes parsed are the bytes copied and sealed
    const std::string bytes = read_tokenizer_file(o.tokenizer);
    t.tok = Tokenizer::parse(bytes, o.tokenizer);
    util::replace_file(path, bytes);
    t.crc32c = crc32c(bytes.data(), bytes.size());
    return with_eot(std::move(t), o);
  }
  if (saved) {
    SealedTokenizer s = load_sealed_tokenizer(path);
    t.tok = std::move(s.tokenizer);
    t.crc32c = s.crc32c;
    return t;
  }
  if (o.tokenizer == "byte") {
    t.tok = std::make_unique<ByteTokenizer>();
  } else {
    if (o.progress)
      std::fprintf(stderr, "prep: training BPE (vocab %u) on up to %" PRIu64 " MiB of training text\n",
                   o.vocab_size, o.bpe_sample_mb);
    const std::string sample = bpe_sample(inputs, o, o.text_chunk_kb * 1024, o.bpe_sample_mb << 20);
    t.tok = std::make_unique<BpeTokenizer>(BpeTokenizer::train(sample, o.vocab_size));
  }
  util::replace_file_with(path, [&](const std::string& temp) { t.tok->save(temp); });
  t.crc32c = tokenizer_file_crc(path);
  return t;
}
}  // namespace

PrepResult prep(const PrepOptions& o) {
  const auto t0 = Clock::now();
  validate(o);
  const bool json_tok = o.tokenizer != "byte" && o.tokenizer != "bpe";
  std::vector<InputInfo> inputs;
  if (o.kjv) inputs.push_back(inspect_input("kjv"));
  for (const auto& f : o.inputs) inputs.push_back(inspect_input(f));
  const bool has_stdin = std::any_of(inputs.begin(), inputs.end(),
                                     [](const InputInfo& i) { return i.kind == InputKind::Stdin; });
  int64_t total_bytes = 0;
  for (const auto& i : inputs) total_bytes = (total_bytes < 0 || i.size < 0) ? -1 : total_bytes + i.size;
  const Fingerprint fp = fingerprint_of(o, inputs, json_tok);
  const pb::PrepRecord record = record_of(o, inputs);
  const std::string manifest_path = (fs::path(o.out) / kManifestName).string();
  const std::string state_path = (fs::path(o.out) / kPrepStateName).string();
  if (fs::exists(manifest_path)) return already_prepared(o, manifest_path, record);

  PrepState st;
  const bool resuming = fs::exists(state_path);
  if (resuming) {
    st = read_prep_state(state_path);
    const std::string change = fingerprint_change(st.fingerprint, fp);
    if (!change.empty())
      throw std::invalid_argument(o.out + " holds a stopped prep of other inputs or options: " +
                                  change + "; rerun with the same arguments, or use a new --out or delete it");
    if (has_stdin)
      throw std::invalid_argument(o.out + " holds a stopped prep that read stdin (-), which cannot "
                                  "be replayed to resume it; use a new --out or delete it");
    check_prep_state(st, inputs, o.shard_tokens, state_path);
  }
  st.fingerprint = fp;
  fs::create_directories(o.out);
  const PrepTokenizer t = prep_tokenizer(o, inputs, json_tok, resuming);
  const uint32_t vocab = t.tok->vocab_size();
  ShardStream streams[2] = {{o.out, 0, o.shard_tokens, vocab}, {o.out, 1, o.shard_tokens, vocab}};
  if (resuming)
    for (int i = 0; i < 2; ++i) streams[i].check_finished(st.split[i]);
  for (int i = 0; i < 2; ++i) streams[i].restore(resuming ? &st.split[i] : nullptr);
  const auto record_state = [&] {
    for (int i = 0; i < 2; ++i) st.split[i] = streams[i].record();
    st.next_tail_crc = input_tail_crc(inputs[st.next.input], st.next.offset);
    util::fsync_dir(o.out);  // shard renames before the state that counts them
    util::replace_file(state_path, prep_state_text(st));
  };
  if (!resuming) record_state();

  TextSource source(inputs, o.text_field, o.text_chunk_kb * 1024);
  if (resuming) source.seek(st.next);
  Progress progress(o.progress, total_bytes);
  auto last_state = Clock::now();
  const unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const auto stop = [&](uint64_t batches_read) {
    if (o.stop_after_batches) return batches_read >= o.stop_after_batches;
    return mod::train::stop_signal_received() != 0;
  };
  // This thread writes every document, in input order, to its split.
  const auto write = [&](const EncodedBatch& b) {
    bool finished = false;
    for (size_t k = 0; k < b.docs.size(); ++k) {
      const Document& d = b.docs[k];
      const size_t from = k ? b.ends[k - 1] : 0;
      const bool val = held_out(o, st.documents) || (d.last && st.val_documents == 0);
      finished |= streams[val ? 1 : 0].append_document(b.tokens.data() + from, b.ends[k] - from);
      ++st.documents;
      st.val_documents += val;
      st.text_bytes += b.text_bytes[k];
      st.next = d.next;
    }
    if (finished || Clock::now() - last_state > std::chrono::seconds(2)) {
      record_state();
      last_state = Clock::now();
    }
    progress.batch(b, st, streams);
  };
  const bool stopped =
      encode_in_order(source, *t.tok, t.eot, threads, o.batch_bytes, stop, write);
  progress.end(st, streams);

  PrepResult result;
  result.manifest = manifest_path;
  result.resumed = resuming;
  const auto fill_result = [&] {
    result.documents = st.documents;
    result.text_bytes = st.text_bytes;
    result.vocab_size = vocab;
    PrepSplit* r[2] = {&result.train, &result.val};
    for (int i = 0; i < 2; ++i) {
      r[i]->shards = streams[i].done().size() + (streams[i].partial() > 0);
      r[i]->tokens = streams[i].tokens();
      r[i]->documents = streams[i].documents();
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  };
  if (stopped) {
    record_state();
    result.stopped = true;
    fill_result();
    return result;
  }

  for (auto& s : streams) s.finish();
  if (streams[1].documents() == 0 || streams[0].documents() == 0)
    throw std::invalid_argument(
        o.out + ": " + inputs_named(inputs) + " hold " + std::to_string(st.documents) +
        " documents: too few to split into training and validation documents (" +
        (o.val_documents > 0 ? "lower --val-documents"
                             : "give more text or a smaller --text-chunk-kb") +
        ")");
  pb::Manifest m;
  m.set_version(1);
  m.set_vocab_size(vocab);
  m.set_tokenizer(t.file);
  m.set_tokenizer_crc32c(t.crc32c);
  if (t.eot) m.set_eot_token(*t.eot);
  for (int i = 0; i < 2; ++i)
    for (const auto& d : streams[i].done()) {
      pb::Shard* s = i ? m.add_val() : m.add_train();
      s->set_path(d.name);
      s->set_format(pb::MODTRAIN);
      s->set_tokens(d.tokens);
      s->set_crc32c(d.crc);
    }
  *m.mutable_prep() = record;
  m.mutable_prep()->set_documents(st.documents);
  m.mutable_prep()->set_text_bytes(st.text_bytes);
  util::fsync_dir(o.out);
  write_manifest(manifest_path, m);
  fs::remove(state_path);
  util::fsync_dir(o.out);
  fill_result();
  return result;
}

std::string index_prep(const IndexOptions& o) {
  TokenFormat format;
  if (o.format == "llmc") {
    format = pb::LLMC;
  } else if (o.format == "nanogpt") {
    format = pb::NANOGPT;
  } else {
    throw std::invalid_argument("--format " + o.format + ": expected llmc or nanogpt");
  }
  if (o.train_shards.empty()) throw std::invalid_argument("--train-shards: give at least one file");
  if (o.val_shards.empty()) throw std::invalid_argument("--val-shards: give at least one file");
  uint32_t vocab = o.vocab_size;
  if (vocab == 0 && format == pb::NANOGPT)
    throw std::invalid_argument("--vocab-size: required for --format nanogpt (e.g. 50257 for GPT-2)");
  if (vocab == 0) vocab = 50257;
  const auto absolute = [](const std::vector<std::string>& v) {
    std::vector<std::string> r;
    for (const auto& p : v) r.push_back(fs::absolute(p).lexically_normal().string());
    return r;
  };
  pb::Manifest m = index_token_files(absolute(o.train_shards), absolute(o.val_shards), format, vocab);
  fs::create_directories(o.out);
  if (!o.tokenizer.empty()) {
    const std::string bytes = read_tokenizer_file(o.tokenizer);  // parsed, copied and sealed once
    const auto tok = Tokenizer::parse(bytes, o.tokenizer);
    const std::string name = o.tokenizer.ends_with(".json") ? "tokenizer.json" : "tokenizer.txt";
    util::replace_file((fs::path(o.out) / name).string(), bytes);
    m.set_tokenizer(name);
    m.set_tokenizer_crc32c(crc32c(bytes.data(), bytes.size()));
    if (const auto e = tok->special_token("<|endoftext|>")) m.set_eot_token(*e);
  }
  const std::string path = (fs::path(o.out) / kManifestName).string();
  write_manifest(path, m);
  return path;
}

}  // namespace mod::data
