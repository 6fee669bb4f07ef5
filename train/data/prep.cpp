// Streaming, parallel, resumable corpus preparation (see prep.h). One reader thread cuts the
// inputs into batches, worker threads encode them, and this thread writes them in input order;
// batches in flight are bounded, so memory never grows with the corpus.
#include "train/data/prep.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "train/data/dataset.h"
#include "train/data/text_source.h"
#include "train/data/token_file.h"
#include "train/data/tokenizer.h"
#include "train/stop_signal.h"

namespace mod::data {

namespace fs = std::filesystem;
namespace pb = modtrain::data;
using Clock = std::chrono::steady_clock;

namespace {
constexpr const char* kStateName = "prep.state";
constexpr const char* kStateMagic = "modtrain-prep-state 1";

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

void fsync_path(const std::string& path, bool dir) {
  const int fd = ::open(path.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes text to path atomically: path.tmp, fsync, rename.
void write_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!(f << text) || !f.flush()) fail(tmp, "cannot write");
  }
  fsync_path(tmp, false);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail(path, "cannot rename " + tmp);
  fsync_path(fs::path(path).parent_path().string(), true);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string shard_name(const std::string& split, uint64_t index) {
  char b[64];
  std::snprintf(b, sizeof b, "%s_%06" PRIu64 ".bin", split.c_str(), index);
  return b;
}

// The options and inputs that shape the output, as (name, value) pairs, so a rerun can say
// which one changed.
using Fingerprint = std::vector<std::pair<std::string, std::string>>;

struct ShardRecord {
  std::string name;
  uint64_t tokens = 0;
  uint32_t crc = 0;
};

// One output split: a sequence of shards of shard_tokens tokens.
struct Stream {
  std::string split;
  uint64_t index = 0;  // the shard being written
  std::unique_ptr<ShardWriter> writer;
  std::vector<ShardRecord> done;
  uint64_t tokens = 0, documents = 0;

  uint64_t partial() const { return writer ? writer->tokens() : 0; }
};

struct State {
  Fingerprint fingerprint;
  Position next;
  uint64_t documents = 0, val_documents = 0, text_bytes = 0;
  struct Split {
    uint64_t index = 0, partial = 0, tokens = 0, documents = 0;
    std::vector<ShardRecord> done;
  } split[2];
};

std::string state_text(const State& s) {
  std::ostringstream o;
  o << kStateMagic << "\n";
  for (const auto& [k, v] : s.fingerprint) o << "option\t" << k << "\t" << v << "\n";
  o << "position " << s.next.input << " " << s.next.offset << " " << s.next.document << " "
    << s.next.line << "\n";
  o << "documents " << s.documents << " " << s.val_documents << " " << s.text_bytes << "\n";
  for (int i = 0; i < 2; ++i) {
    const auto& p = s.split[i];
    o << "split " << i << " " << p.index << " " << p.partial << " " << p.tokens << " "
      << p.documents << "\n";
    for (const auto& d : p.done) o << "shard " << i << " " << d.name << " " << d.tokens << " " << d.crc << "\n";
  }
  o << "end\n";
  return o.str();
}

State parse_state(const std::string& path) {
  std::istringstream in(read_text(path));
  State s;
  std::string line;
  int line_no = 0;
  bool ended = false;
  auto bad = [&](const std::string& why) {
    fail(path + ":" + std::to_string(line_no), why + " (delete the directory to start over)");
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (line_no == 1) {
      if (line != kStateMagic) bad("not a prep state");
      continue;
    }
    if (line.rfind("option\t", 0) == 0) {
      const size_t tab = line.find('\t', 7);
      if (tab == std::string::npos) bad("bad option line");
      s.fingerprint.emplace_back(line.substr(7, tab - 7), line.substr(tab + 1));
      continue;
    }
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "position") {
      ls >> s.next.input >> s.next.offset >> s.next.document >> s.next.line;
    } else if (key == "documents") {
      ls >> s.documents >> s.val_documents >> s.text_bytes;
    } else if (key == "split") {
      int i = -1;
      ls >> i;
      if (i < 0 || i > 1) bad("bad split");
      ls >> s.split[i].index >> s.split[i].partial >> s.split[i].tokens >> s.split[i].documents;
    } else if (key == "shard") {
      int i = -1;
      ShardRecord r;
      ls >> i >> r.name >> r.tokens >> r.crc;
      if (i < 0 || i > 1) bad("bad shard");
      s.split[i].done.push_back(r);
    } else if (key == "end") {
      ended = true;
    } else {
      bad("unknown line '" + line + "'");
    }
    if (ls.fail()) bad("bad line '" + line + "'");
  }
  if (!ended) bad("truncated");
  return s;
}

// "what changed" between a recorded fingerprint and this run's, or "" when they agree.
std::string fingerprint_change(const Fingerprint& was, const Fingerprint& now) {
  std::map<std::string, std::string> a(was.begin(), was.end()), b(now.begin(), now.end());
  for (const auto& [k, v] : now) {
    const auto it = a.find(k);
    if (it == a.end()) return k + " was not given before, is now " + v;
    if (it->second != v) return k + " was " + it->second + ", is now " + v;
  }
  for (const auto& [k, v] : was)
    if (!b.count(k)) return k + " was " + v + ", is now not given";
  return "";
}

void remove_split_files(const std::string& out, const std::string& split, uint64_t from_index) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string n = e.path().filename().string();
    const std::string prefix = split + "_";
    if (n.rfind(prefix, 0) != 0) continue;
    const size_t dot = n.find(".bin");
    if (dot == std::string::npos) continue;
    const std::string digits = n.substr(prefix.size(), dot - prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    if (std::stoull(digits) >= from_index) fs::remove(e.path());
  }
}

struct Batch {
  uint64_t seq = 0;
  std::vector<Document> docs;
  std::vector<uint32_t> tokens;
  std::vector<size_t> ends;  // docs[k]'s tokens end at tokens[ends[k]]
  std::vector<size_t> text_bytes;  // docs[k]'s text size (the text is freed once encoded)
};

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

// Training documents from the start of the corpus, up to limit bytes (BPE's sample).
std::string bpe_sample(const std::vector<InputInfo>& inputs, const PrepOptions& o, size_t chunk,
                       uint64_t limit) {
  TextSource src(inputs, o.text_field, chunk);
  std::string sample;
  Document d;
  const uint64_t threshold = static_cast<uint64_t>(o.val_fraction * 0x1p64);
  for (uint64_t i = 0; sample.size() < limit && src.next(d); ++i) {
    const bool val = o.val_documents > 0 ? i < o.val_documents
                                         : splitmix64(o.seed + i) < threshold;
    if (val) continue;
    sample.append(d.text, 0, std::min<size_t>(d.text.size(), limit - sample.size()));
    if (d.eot_after && sample.size() < limit) sample += '\n';
  }
  return sample;
}
}  // namespace

PrepResult prep(const PrepOptions& o) {
  const auto t0 = Clock::now();
  validate(o);
  const std::string& out = o.out;
  const bool json_tok = o.tokenizer != "byte" && o.tokenizer != "bpe";
  const size_t chunk = static_cast<size_t>(o.text_chunk_kb) * 1024;

  std::vector<InputInfo> inputs;
  if (o.kjv) inputs.push_back(inspect_input("kjv"));
  for (const auto& f : o.inputs) inputs.push_back(inspect_input(f));
  const bool has_stdin = std::any_of(inputs.begin(), inputs.end(),
                                     [](const InputInfo& i) { return i.kind == InputKind::Stdin; });
  int64_t total_bytes = 0;
  for (const auto& i : inputs) total_bytes = (total_bytes < 0 || i.size < 0) ? -1 : total_bytes + i.size;

  Fingerprint fp;
  for (size_t i = 0; i < inputs.size(); ++i)
    fp.emplace_back("input " + std::to_string(i),
                    inputs[i].name + (inputs[i].size >= 0 ? " (" + std::to_string(inputs[i].size) + " bytes)" : ""));
  fp.emplace_back("--tokenizer", o.tokenizer + (json_tok ? " (" + std::to_string(fs::file_size(o.tokenizer)) + " bytes)" : ""));
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

  pb::PrepRecord record;
  for (const auto& i : inputs) record.add_inputs(i.name);
  record.set_tokenizer(o.tokenizer);
  record.set_shard_tokens(o.shard_tokens);
  record.set_val_fraction(o.val_documents > 0 ? 0 : o.val_fraction);
  record.set_val_documents(o.val_documents);
  record.set_seed(o.seed);

  PrepResult result;
  const std::string manifest_path = (fs::path(out) / kManifestName).string();
  const std::string state_path = (fs::path(out) / kStateName).string();
  result.manifest = manifest_path;

  // A finished directory: the same prep is skipped, another one refused.
  if (fs::exists(manifest_path)) {
    const pb::Manifest m = read_manifest(manifest_path);
    pb::PrepRecord was = m.prep();
    const uint64_t docs = was.documents(), bytes = was.text_bytes();
    was.clear_documents();
    was.clear_text_bytes();
    if (was.SerializeAsString() != record.SerializeAsString() ||
        (o.tokenizer == "bpe" && m.vocab_size() != o.vocab_size))
      throw std::invalid_argument(
          out + " already holds a dataset prepared from other inputs or options (its manifest's "
                "prep record differs); use a new --out or delete it");
    fs::remove(state_path);
    result.already_prepared = true;
    result.documents = docs;
    result.text_bytes = bytes;
    result.vocab_size = m.vocab_size();
    for (const auto& s : m.train()) ++result.train.shards, result.train.tokens += s.tokens();
    for (const auto& s : m.val()) ++result.val.shards, result.val.tokens += s.tokens();
    return result;
  }

  std::optional<State> resume;
  if (fs::exists(state_path)) {
    State s = parse_state(state_path);
    const std::string change = fingerprint_change(s.fingerprint, fp);
    if (!change.empty())
      throw std::invalid_argument(out + " holds a stopped prep of other inputs or options: " +
                                  change + "; rerun with the same arguments, or use a new --out or delete it");
    if (has_stdin)
      throw std::invalid_argument(out + " holds a stopped prep that read stdin (-), which cannot "
                                  "be replayed to resume it; use a new --out or delete it");
    resume = std::move(s);
  }
  fs::create_directories(out);

  // The tokenizer, saved before any shard so a resumed prep encodes with the same one.
  std::unique_ptr<Tokenizer> tok;
  const std::string tok_name = json_tok ? "tokenizer.json" : "tokenizer.txt";
  const std::string tok_path = (fs::path(out) / tok_name).string();
  if (o.tokenizer == "byte") {
    tok = std::make_unique<ByteTokenizer>();
  } else if (json_tok) {
    tok = Tokenizer::load(o.tokenizer);
  } else if (resume && fs::exists(tok_path)) {
    tok = Tokenizer::load(tok_path);
  } else {
    const uint64_t limit = o.bpe_sample_mb << 20;
    if (o.progress) std::fprintf(stderr, "prep: training BPE (vocab %u) on up to %" PRIu64 " MiB of training text\n", o.vocab_size, o.bpe_sample_mb);
    const std::string sample = bpe_sample(inputs, o, chunk, limit);
    tok = std::make_unique<BpeTokenizer>(BpeTokenizer::train(sample, o.vocab_size));
  }
  if (json_tok) {
    write_atomic(tok_path, read_text(o.tokenizer));
  } else if (!(resume && fs::exists(tok_path))) {
    tok->save(tok_path + ".tmp");
    fsync_path(tok_path + ".tmp", false);
    if (std::rename((tok_path + ".tmp").c_str(), tok_path.c_str()) != 0) fail(tok_path, "cannot rename");
  }
  const uint32_t vocab = tok->vocab_size();
  std::optional<uint32_t> eot;
  if (json_tok) {
    const std::string name = o.eot.empty() ? "<|endoftext|>" : o.eot;
    eot = tok->special_token(name);
    if (!eot && !o.eot.empty())
      throw std::invalid_argument("--eot " + o.eot + ": not a special token of " + o.tokenizer);
  }

  // The writer's state: streams, counts, the next document's position.
  Stream streams[2];
  streams[0].split = "train";
  streams[1].split = "val";
  State st;
  st.fingerprint = fp;
  if (resume) {
    st = *resume;
    result.resumed = true;
    for (int i = 0; i < 2; ++i) {
      Stream& s = streams[i];
      const auto& r = st.split[i];
      s.index = r.index;
      s.done = r.done;
      s.tokens = r.tokens;
      s.documents = r.documents;
      for (const auto& d : s.done)
        if (!fs::exists(fs::path(out) / d.name))
          fail((fs::path(out) / d.name).string(), "missing: the stopped prep cannot resume (delete " + out + " to start over)");
      remove_split_files(out, s.split, s.index + 1);
      const std::string path = (fs::path(out) / shard_name(s.split, s.index)).string();
      if (r.partial > 0) {
        // Finished after the state was recorded: reopen it as the partial it was.
        if (!fs::exists(path + ".partial") && fs::exists(path)) fs::rename(path, path + ".partial");
        s.writer = std::make_unique<ShardWriter>(path, vocab, r.partial);
      } else {
        fs::remove(path);
        fs::remove(path + ".partial");
      }
    }
  } else {
    for (auto& s : streams) remove_split_files(out, s.split, 0);
  }
  st.fingerprint = fp;

  const auto record_state = [&] {
    for (int i = 0; i < 2; ++i) {
      if (streams[i].writer) streams[i].writer->sync();
      st.split[i].index = streams[i].index;
      st.split[i].partial = streams[i].partial();
      st.split[i].tokens = streams[i].tokens;
      st.split[i].documents = streams[i].documents;
      st.split[i].done = streams[i].done;
    }
    fsync_path(out, true);  // shard renames before the state that counts them
    write_atomic(state_path, state_text(st));
  };
  if (!resume) record_state();

  // Appends n tokens to s, finishing shards at shard_tokens; true when one was finished.
  const auto append = [&](Stream& s, const uint32_t* t, size_t n) {
    bool finished = false;
    while (n > 0) {
      if (!s.writer)
        s.writer = std::make_unique<ShardWriter>((fs::path(out) / shard_name(s.split, s.index)).string(), vocab);
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, o.shard_tokens - s.writer->tokens()));
      s.writer->append(t, take);
      t += take;
      n -= take;
      s.tokens += take;
      if (s.writer->tokens() == o.shard_tokens) {
        const uint32_t crc = s.writer->finish();
        s.done.push_back({shard_name(s.split, s.index), o.shard_tokens, crc});
        s.writer.reset();
        ++s.index;
        finished = true;
      }
    }
    return finished;
  };
  const uint64_t threshold = static_cast<uint64_t>(o.val_fraction * 0x1p64);
  const auto held_out = [&](uint64_t i, bool last) {
    if (o.val_documents > 0) return i < o.val_documents;
    return splitmix64(o.seed + i) < threshold || (last && st.val_documents == 0);
  };

  // The pipeline: reader -> workers -> this thread, in batch order.
  const unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const size_t max_in_flight = threads + 2;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Batch>> todo;
  std::map<uint64_t, std::shared_ptr<Batch>> encoded;
  size_t in_flight = 0;
  uint64_t batches_read = 0;
  bool reader_done = false, abort = false, stopped = false;
  std::exception_ptr error;
  const auto stop_requested = [&] {
    if (o.stop_after_batches) return batches_read >= o.stop_after_batches;
    return mod::train::stop_signal_received() != 0;
  };
  const auto set_error = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> l(mu);
    if (!error) error = e;
    abort = true;
    cv.notify_all();
  };

  std::vector<std::thread> pool;
  const auto join_all = [&] {
    {
      std::lock_guard<std::mutex> l(mu);
      abort = abort || error;
    }
    cv.notify_all();
    for (auto& t : pool) t.join();
    pool.clear();
  };
  pool.emplace_back([&] {
    try {
      TextSource src(inputs, o.text_field, chunk);
      if (resume) src.seek(st.next);
      for (;;) {
        if (stop_requested()) {
          std::lock_guard<std::mutex> l(mu);
          stopped = true;
          break;
        }
        auto b = std::make_shared<Batch>();
        size_t bytes = 0;
        Document d;
        while (bytes < o.batch_bytes && src.next(d)) {
          bytes += d.text.size() + 1;
          b->docs.push_back(std::move(d));
        }
        if (b->docs.empty()) break;
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return in_flight < max_in_flight || abort; });
        if (abort) return;
        b->seq = batches_read++;
        ++in_flight;
        todo.push_back(std::move(b));
        cv.notify_all();
      }
    } catch (...) {
      set_error(std::current_exception());
      return;
    }
    std::lock_guard<std::mutex> l(mu);
    reader_done = true;
    cv.notify_all();
  });
  for (unsigned w = 0; w < threads; ++w)
    pool.emplace_back([&] {
      try {
        for (;;) {
          std::shared_ptr<Batch> b;
          {
            std::unique_lock<std::mutex> l(mu);
            cv.wait(l, [&] { return !todo.empty() || reader_done || abort; });
            if (abort || todo.empty()) return;
            b = std::move(todo.front());
            todo.pop_front();
          }
          for (auto& d : b->docs) {
            const std::vector<uint32_t> t = tok->encode(d.text);
            b->tokens.insert(b->tokens.end(), t.begin(), t.end());
            if (eot && d.eot_after) b->tokens.push_back(*eot);
            b->ends.push_back(b->tokens.size());
            b->text_bytes.push_back(d.text.size());
            std::string().swap(d.text);  // batches wait for the writer: hold only their tokens
          }
          b->tokens.shrink_to_fit();
          std::lock_guard<std::mutex> l(mu);
          encoded[b->seq] = std::move(b);
          cv.notify_all();
        }
      } catch (...) {
        set_error(std::current_exception());
      }
    });

  // Progress: at most every 2 s on a terminal (\r), one line per 10 s otherwise.
  const bool tty = ::isatty(2);
  const double every = tty ? 2.0 : 10.0;
  auto last_state = Clock::now(), last_print = Clock::now();
  const auto run_start = Clock::now();
  uint64_t start_bytes = 0, cur_bytes = 0;
  bool have_start = false, printed = false;
  const auto print_progress = [&](bool final_line) {
    const double secs = std::chrono::duration<double>(Clock::now() - run_start).count();
    const double mb = cur_bytes / 1e6, rate = secs > 0 ? (cur_bytes - start_bytes) / 1e6 / secs : 0;
    char eta[64] = "";
    if (total_bytes > 0 && rate > 0)
      std::snprintf(eta, sizeof eta, ", ETA %.0fs", std::max(0.0, (total_bytes / 1e6 - mb) / rate));
    char total[64] = "";
    if (total_bytes > 0) std::snprintf(total, sizeof total, " / %.1f", total_bytes / 1e6);
    std::fprintf(stderr, "%sprep: %.1f%s MB read, %.1f MB/s, %" PRIu64 " documents, %" PRIu64
                 " tokens, %" PRIu64 " shards%s%s",
                 tty ? "\r" : "", mb, total, rate, st.documents, streams[0].tokens + streams[1].tokens,
                 static_cast<uint64_t>(streams[0].done.size() + streams[1].done.size()), eta,
                 tty && !final_line ? "" : "\n");
    std::fflush(stderr);
    printed = true;
  };

  try {
    for (uint64_t next = 0;; ++next) {
      std::shared_ptr<Batch> b;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return encoded.count(next) || error || ((reader_done || stopped) && batches_read == next); });
        if (error) break;
        if (!encoded.count(next)) break;
        b = std::move(encoded[next]);
        encoded.erase(next);
        --in_flight;
        cv.notify_all();
      }
      bool finished = false;
      for (size_t k = 0; k < b->docs.size(); ++k) {
        const Document& d = b->docs[k];
        const size_t from = k ? b->ends[k - 1] : 0;
        const bool val = held_out(st.documents, d.last);
        Stream& s = streams[val ? 1 : 0];
        finished |= append(s, b->tokens.data() + from, b->ends[k] - from);
        ++s.documents;
        ++st.documents;
        st.val_documents += val;
        st.text_bytes += b->text_bytes[k];
        st.next = d.next;
        cur_bytes = d.input_bytes;
      }
      if (!have_start) {
        have_start = true;
        start_bytes = b->docs.front().input_bytes - std::min<uint64_t>(b->docs.front().input_bytes, b->text_bytes.front());
      }
      if (finished || Clock::now() - last_state > std::chrono::seconds(2)) {
        record_state();
        last_state = Clock::now();
      }
      if (o.progress && std::chrono::duration<double>(Clock::now() - last_print).count() >= every) {
        print_progress(false);
        last_print = Clock::now();
      }
    }
  } catch (...) {
    set_error(std::current_exception());
  }
  join_all();
  if (error) std::rethrow_exception(error);
  if (o.progress && printed) print_progress(true);

  const auto fill_result = [&] {
    result.documents = st.documents;
    result.text_bytes = st.text_bytes;
    result.vocab_size = vocab;
    PrepSplit* r[2] = {&result.train, &result.val};
    for (int i = 0; i < 2; ++i) {
      r[i]->shards = streams[i].done.size() + (streams[i].partial() > 0);
      r[i]->tokens = streams[i].tokens;
      r[i]->documents = streams[i].documents;
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  };
  if (stopped) {
    record_state();
    result.stopped = true;
    fill_result();
    return result;
  }

  for (auto& s : streams)
    if (s.writer) {
      const uint64_t n = s.writer->tokens();
      const uint32_t crc = s.writer->finish();
      s.done.push_back({shard_name(s.split, s.index), n, crc});
      s.writer.reset();
      ++s.index;
    }
  if (streams[1].documents == 0 || streams[0].documents == 0)
    throw std::invalid_argument(
        std::to_string(st.documents) + " documents: too few to split into training and validation "
        "documents (" + (o.val_documents > 0 ? "lower --val-documents" : "give more text or a smaller --text-chunk-kb") + ")");

  pb::Manifest m;
  m.set_version(1);
  m.set_vocab_size(vocab);
  m.set_tokenizer(tok_name);
  if (eot) m.set_eot_token(*eot);
  for (int i = 0; i < 2; ++i)
    for (const auto& d : streams[i].done) {
      pb::Shard* s = i ? m.add_val() : m.add_train();
      s->set_path(d.name);
      s->set_format(pb::MODTRAIN);
      s->set_tokens(d.tokens);
      s->set_crc32c(d.crc);
    }
  *m.mutable_prep() = record;
  m.mutable_prep()->set_documents(st.documents);
  m.mutable_prep()->set_text_bytes(st.text_bytes);
  fsync_path(out, true);
  write_manifest(manifest_path, m);
  fs::remove(state_path);
  fsync_path(out, true);
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
    const auto tok = Tokenizer::load(o.tokenizer);
    const std::string name = o.tokenizer.ends_with(".json") ? "tokenizer.json" : "tokenizer.txt";
    write_atomic((fs::path(o.out) / name).string(), read_text(o.tokenizer));
    m.set_tokenizer(name);
    if (const auto e = tok->special_token("<|endoftext|>")) m.set_eot_token(*e);
  }
  const std::string path = (fs::path(o.out) / kManifestName).string();
  write_manifest(path, m);
  return path;
}

}  // namespace mod::data
