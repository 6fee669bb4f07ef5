// HfTokenizer: tokenizer.json (byte-level BPE) loading and encoding, step for step as the
// `tokenizers` library does it: replace invalid UTF-8, split out added tokens (AddedVocabulary),
// pre-tokenize (Split / ByteLevel), then BPE each pre-token with merges applied lowest rank
// first, leftmost on ties. The model works on raw bytes: the byte-level map is a bijection, so
// looking up bytes is the same as looking up the mapped characters, without building them.
#include "train/data/hf_tokenizer.h"

#include "core/util/json_nesting.h"
#include "train/data/hf_json.h"
#include "train/data/hf_regex.h"
#include "train/data/unicode.h"

#include <array>
#include <atomic>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <sstream>
#include <stdexcept>

namespace mod::data {

using nlohmann::json;
using hf::Json;
using hf::MatchScratch;
using hf::Regex;

namespace {

uint64_t pair_key(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }

std::atomic<uint64_t> g_next_instance{1};

const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool lstrip = false, rstrip = false, normalized = false, special = false;
};

// One pass of AddedVocabulary: its tokens, indexed by first byte, longest first.
struct AddedPass {
  std::array<std::vector<const AddedToken*>, 256> by_first{};
  bool empty = true;
};

// A stretch of the text: an added token's id, or text still to pre-tokenize.
struct Segment {
  bool is_token;
  uint32_t id;
  size_t begin, end;
};

struct PreStep {
  enum Kind { kSplitRegex, kSplitString, kByteLevel } kind = kByteLevel;
  bool removed = false;  // behavior Removed (else Isolated)
  std::unique_ptr<Regex> regex;
  std::string literal;
  bool add_prefix_space = false;
  bool use_regex = true;
  size_t regex_slot = 0;  // index of this step's match data in ThreadState
};

}  // namespace

// ---- per-thread state: word cache and PCRE2 match data ----

namespace {
struct ThreadState {
  std::unordered_map<std::string_view, std::vector<uint32_t>> cache;  // bytes -> ids
  std::deque<std::string> keys;                                       // owns the cache's keys
  std::vector<pcre2_match_data*> match_data;
  MatchScratch scratch;
  ~ThreadState() {
    for (auto* md : match_data) pcre2_match_data_free(md);
  }
};
constexpr size_t kCacheEntries = 1 << 17;
}  // namespace

struct HfTokenizer::Impl {
  std::string name;
  uint64_t instance = g_next_instance++;
  std::vector<PreStep> steps;
  size_t n_regex = 0;
  bool ignore_merges = false;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, uint32_t> added_by_content;
  AddedPass pass_raw, pass_normalized;  // normalized=false tokens first, as the library does
  std::unordered_map<std::string, uint32_t> vocab;        // raw bytes -> id
  std::array<int64_t, 256> byte_id{};                     // id of each one-byte token, or -1
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges;  // pair -> (rank, id)
  std::vector<std::optional<std::string>> id_bytes;       // id -> bytes for decode

  ThreadState& thread_state() const;
  void split_added(std::string_view text, size_t base, const AddedPass& pass,
                   std::vector<Segment>& out) const;
  void pretokenize(size_t step, std::string_view piece, ThreadState& ts,
                   std::vector<uint32_t>& out) const;
  void model(std::string_view word, ThreadState& ts, std::vector<uint32_t>& out) const;
  std::vector<uint32_t> merge_word(std::string_view word) const;
};

ThreadState& HfTokenizer::Impl::thread_state() const {
  // Keyed by a never-reused instance number, so a dead tokenizer's state is never picked up.
  thread_local std::unordered_map<uint64_t, std::unique_ptr<ThreadState>> states;
  auto it = states.find(instance);
  if (it != states.end()) return *it->second;
  if (states.size() >= 16) states.clear();  // states of tokenizers long gone
  auto ts = std::make_unique<ThreadState>();
  for (size_t i = 0; i < n_regex; ++i) ts->match_data.push_back(pcre2_match_data_create(1, nullptr));
  return *(states[instance] = std::move(ts));
}

// AddedVocabulary::find_matches: leftmost-longest matches, scanning on from each match's end;
// lstrip/rstrip widen the match over whitespace, never before the previous match's end.
void HfTokenizer::Impl::split_added(std::string_view s, size_t base, const AddedPass& pass,
                                    std::vector<Segment>& out) const {
  auto push = [&](bool is_token, uint32_t id, size_t b, size_t e) {
    if (e > b) out.push_back({is_token, id, base + b, base + e});
  };
  size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    const AddedToken* hit = nullptr;
    size_t at = pos;
    for (; at < s.size() && !hit; ++at) {
      for (const AddedToken* t : pass.by_first[static_cast<unsigned char>(s[at])]) {
        if (s.compare(at, t->content.size(), t->content) == 0) {
          hit = t;
          break;
        }
      }
    }
    if (!hit) break;
    size_t start = at - 1, stop = start + hit->content.size();
    pos = stop;
    if (hit->lstrip) {
      size_t k = start;  // back over whitespace characters
      while (k > 0) {
        size_t p = k - 1;
        while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
        size_t len;
        if (!is_white_space(decode_char(s, p, &len))) break;
        k = p;
      }
      start = std::max(k, start_offset);
    }
    if (hit->rstrip) {
      while (stop < s.size()) {
        size_t len;
        if (!is_white_space(decode_char(s, stop, &len))) break;
        stop += len;
      }
    }
    if (start > start_offset) push(false, 0, start_offset, start);
    push(true, hit->id, start, stop);
    start_offset = stop;
  }
  if (start_offset < s.size()) push(false, 0, start_offset, s.size());
}

void HfTokenizer::Impl::pretokenize(size_t step, std::string_view piece, ThreadState& ts,
                                    std::vector<uint32_t>& out) const {
  if (piece.empty()) return;  // the library drops empty splits
  const PreStep& ps = steps[step];
  auto emit = [&](std::string_view sub) {
    if (ps.kind == PreStep::kByteLevel) model(sub, ts, out);
    else pretokenize(step + 1, sub, ts, out);
  };
  // Isolated: gaps and matches each become a piece; Removed: only the gaps.
  auto split = [&](std::string_view s, auto&& for_each_match) {
    size_t prev = 0;
    for_each_match([&](size_t st, size_t en) {
      if (st > prev) emit(s.substr(prev, st - prev));
      if (!ps.removed) emit(s.substr(st, en - st));
      prev = en;
    });
    if (prev < s.size()) emit(s.substr(prev));
  };
  switch (ps.kind) {
    case PreStep::kSplitRegex:
      split(piece, [&](auto&& f) {
        ps.regex->find_iter(piece, ts.match_data[ps.regex_slot], ts.scratch, f);
      });
      break;
    case PreStep::kSplitString:
      split(piece, [&](auto&& f) {
        for (size_t at = piece.find(ps.literal); at != std::string_view::npos;
             at = piece.find(ps.literal, at + ps.literal.size()))
          f(at, at + ps.literal.size());
      });
      break;
    case PreStep::kByteLevel: {
      std::string prefixed;
      std::string_view s = piece;
      if (ps.add_prefix_space && piece.front() != ' ') {
        prefixed.resize(piece.size() + 1);
        prefixed[0] = ' ';
        piece.copy(&prefixed[1], piece.size());
        s = prefixed;
      }
      if (ps.use_regex)
        split(s, [&](auto&& f) {
          ps.regex->find_iter(s, ts.match_data[ps.regex_slot], ts.scratch, f);
        });
      else
        model(s, ts, out);
      break;
    }
  }
}

void HfTokenizer::Impl::model(std::string_view word, ThreadState& ts,
                              std::vector<uint32_t>& out) const {
  auto it = ts.cache.find(word);
  if (it == ts.cache.end()) {
    if (ts.cache.size() >= kCacheEntries) {
      ts.cache.clear();
      ts.keys.clear();
    }
    std::vector<uint32_t> ids;
    std::string key(word);
    auto v = ignore_merges ? vocab.find(key) : vocab.end();
    if (v != vocab.end()) ids.push_back(v->second);  // ignore_merges: a whole word in the vocab
    else ids = merge_word(word);
    ts.keys.push_back(std::move(key));
    it = ts.cache.emplace(ts.keys.back(), std::move(ids)).first;
  }
  out.insert(out.end(), it->second.begin(), it->second.end());
}

// Word::merge_all: a heap of (rank, position); the lowest rank merges first, the leftmost on
// ties; entries whose pair has since changed are skipped.
std::vector<uint32_t> HfTokenizer::Impl::merge_word(std::string_view word) const {
  struct Symbol {
    uint32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (unsigned char b : word) {
    if (byte_id[b] < 0) continue;  // no unk_token: the library drops the character
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<uint32_t>(byte_id[b]), n - 1, n + 1, true});
  }
  if (sym.empty()) return {};
  sym.back().next = -1;
  struct Merge {
    uint32_t rank, new_id;
    int32_t pos;
  };
  auto worse = [](const Merge& a, const Merge& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Merge, std::vector<Merge>, decltype(worse)> heap(worse);
  auto push = [&](int32_t pos) {
    const int32_t nx = sym[pos].next;
    if (nx < 0) return;
    auto m = merges.find(pair_key(sym[pos].id, sym[nx].id));
    if (m != merges.end()) heap.push({m->second.first, m->second.second, pos});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) push(i);
  while (!heap.empty()) {
    const Merge top = heap.top();
    heap.pop();
    Symbol& cur = sym[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    auto m = merges.find(pair_key(cur.id, sym[cur.next].id));
    if (m == merges.end() || m->second.second != top.new_id) continue;  // stale entry
    Symbol& right = sym[cur.next];
    right.alive = false;
    cur.id = top.new_id;
    cur.next = right.next;
    if (cur.next >= 0) sym[cur.next].prev = top.pos;
    if (cur.prev >= 0) push(cur.prev);
    push(top.pos);
  }
  std::vector<uint32_t> ids;
  for (const Symbol& s : sym)
    if (s.alive) ids.push_back(s.id);
  return ids;
}

// ---- loading ----

namespace {
// The tokenizers library (serde_json) refuses JSON nested deeper than 128. Sequences nest 2 JSON
// levels each, so 32 is far beyond any real file; the steps run as a recursion at encode, and a
// real file has 1 to 3 of them.
constexpr int kMaxJsonDepth = 128;
constexpr int kMaxSequenceDepth = 32;
constexpr size_t kMaxPreSteps = 64;

void add_pre_tokenizer(const json& pt, const std::string& path, const Json& j,
                       std::vector<PreStep>& steps, int depth) {
  if (depth > kMaxSequenceDepth)
    j.fail(path + ": Sequence nested deeper than " + std::to_string(kMaxSequenceDepth) + " levels");
  const std::string type = j.str(pt, "type", path);
  if (type == "Sequence") {
    const json& arr = j.field(pt, "pretokenizers", path);
    if (!arr.is_array()) j.fail(path + ".pretokenizers must be an array");
    for (size_t i = 0; i < arr.size(); ++i) {
      const std::string step = path + ".pretokenizers[" + std::to_string(i) + "]";
      if (steps.size() >= kMaxPreSteps)
        j.fail(step + ": more than " + std::to_string(kMaxPreSteps) + " pre-tokenizer steps");
      add_pre_tokenizer(arr[i], step, j, steps, depth + 1);
    }
  } else if (type == "ByteLevel") {
    PreStep s;
    s.kind = PreStep::kByteLevel;
    s.add_prefix_space = j.boolean(pt, "add_prefix_space", path, true);
    s.use_regex = j.boolean(pt, "use_regex", path, true);
    if (s.use_regex) s.regex = std::make_unique<Regex>(kGpt2Pattern, j, path);
    steps.push_back(std::move(s));
  } else if (type == "Split") {
    PreStep s;
    s.kind = PreStep::kSplitRegex;
    const json& pat = j.field(pt, "pattern", path);
    if (pat.is_object() && pat.contains("Regex")) {
      s.regex = std::make_unique<Regex>(j.str(pat, "Regex", path + ".pattern"), j,
                                        path + ".pattern.Regex");
    } else if (pat.is_object() && pat.contains("String")) {
      s.kind = PreStep::kSplitString;
      s.literal = j.str(pat, "String", path + ".pattern");
      if (s.literal.empty()) j.fail(path + ".pattern.String must not be empty");
    } else {
      j.fail(path + ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string behavior = j.str(pt, "behavior", path);
    if (behavior != "Isolated" && behavior != "Removed")
      j.fail(path + ".behavior \"" + behavior + "\" is not supported (supported: Isolated, Removed)");
    s.removed = behavior == "Removed";
    if (j.boolean(pt, "invert", path, false))
      j.fail(path + ".invert true is not supported (supported: false)");
    steps.push_back(std::move(s));
  } else {
    j.fail(path + ".type \"" + type + "\" is not supported (supported: ByteLevel, Split, Sequence)");
  }
}

uint32_t as_id(const json& v, const std::string& path, const Json& j) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() >= UINT32_MAX)
    j.fail(path + " must be a token id (an integer from 0 to 2^32-2), got " + v.dump());
  return v.get<uint32_t>();
}
}  // namespace

HfTokenizer::HfTokenizer(std::string json_text, const std::string& name)
    : json_text_(std::move(json_text)), impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.name = name;
  const Json j{m.name};
  check_json_nesting(json_text_, kMaxJsonDepth, m.name + ": JSON");
  json root;
  try {
    root = json::parse(json_text_);
  } catch (const json::exception& e) {
    j.fail(std::string("malformed JSON: ") + e.what());
  }
  if (!root.is_object()) j.fail("malformed JSON: the top level is not an object");
  // The library refuses a field it does not know and any version but "1.0"; so do we, or a file
  // it cannot load would pass here and tokenize a dataset no other tool can reproduce.
  static const std::set<std::string> kTopLevel = {
      "version", "truncation", "padding", "added_tokens", "normalizer",
      "pre_tokenizer", "post_processor", "decoder", "model"};
  for (auto it = root.begin(); it != root.end(); ++it)
    if (!kTopLevel.count(it.key()))
      j.fail("unknown top-level field \"" + it.key() +
             "\" (known: version, truncation, padding, added_tokens, normalizer, pre_tokenizer, "
             "post_processor, decoder, model)");
  if (root.contains("version")) {
    const json& v = root["version"];
    if (!v.is_string() || v.get<std::string>() != "1.0")
      j.fail("version " + v.dump() + " is not supported (supported: \"1.0\")");
  }
  // The post-processor only adds special tokens around a sequence, which encoding for training
  // never asks for; it is still checked for shape, as the library does.
  if (root.contains("post_processor") && !root["post_processor"].is_null())
    j.str(root["post_processor"], "type", "post_processor");

  for (const char* key : {"truncation", "padding"})
    if (root.contains(key) && !root[key].is_null())
      j.fail(std::string(key) + " is not supported (supported: null): it changes the ids");

  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    const json& n = root["normalizer"];
    const std::string type = j.str(n, "type", "normalizer");
    const bool empty_sequence = type == "Sequence" && n.contains("normalizers") &&
                                n["normalizers"].is_array() && n["normalizers"].empty();
    if (!empty_sequence)
      j.fail("normalizer.type \"" + type + "\" is not supported (supported: null)");
  }

  if (root.contains("decoder") && !root["decoder"].is_null()) {
    const std::string type = j.str(root["decoder"], "type", "decoder");
    if (type != "ByteLevel")
      j.fail("decoder.type \"" + type + "\" is not supported (supported: ByteLevel, null)");
  }

  // pre_tokenizer: Split steps, then exactly one ByteLevel, last.
  if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null())
    j.fail("pre_tokenizer null or absent is not supported (supported: ByteLevel, Split, Sequence)");
  add_pre_tokenizer(root["pre_tokenizer"], "pre_tokenizer", j, m.steps, 0);
  if (m.steps.empty())
    j.fail(
        "pre_tokenizer: no steps is not supported (a ByteLevel step must come last, once: the "
        "byte-level BPE family)");
  for (size_t i = 0; i < m.steps.size(); ++i) {
    const bool last = i + 1 == m.steps.size();
    if ((m.steps[i].kind == PreStep::kByteLevel) != last)
      j.fail("pre_tokenizer: a ByteLevel step must come last, once (the byte-level BPE family)");
    if (m.steps[i].regex) m.steps[i].regex_slot = m.n_regex++;
  }

  // model
  const json& model = j.field(root, "model", "");
  // The library reads a model without "type" by its fields; ours has BPE's, so absent means BPE.
  const std::string type = model.is_object() && !model.contains("type") ? "BPE"
                                                                         : j.str(model, "type", "model");
  if (type != "BPE")
    j.fail("model.type \"" + type + "\" is not supported (supported: BPE)");
  j.null_or(model, "dropout", "model", {}, "null");
  j.null_or(model, "unk_token", "model", {}, "null");
  j.null_or(model, "continuing_subword_prefix", "model", {""}, "null, \"\"");
  j.null_or(model, "end_of_word_suffix", "model", {""}, "null, \"\"");
  if (j.boolean(model, "byte_fallback", "model", false))
    j.fail("model.byte_fallback true is not supported (supported: false)");
  m.ignore_merges = j.boolean(model, "ignore_merges", "model", false);

  const json& vocab = j.field(model, "vocab", "model");
  if (!vocab.is_object()) j.fail("model.vocab must be an object of token -> id");
  const ByteMap& bm = byte_map();
  int64_t max_id = -1;
  std::vector<std::optional<std::string>>& id_bytes = m.id_bytes;
  // Ids index a table: one far beyond the tokens the file holds would size it from an
  // unchecked number (a 4e9 id is 160 GB), so ids stay within the tokens listed plus slack.
  const size_t n_added = root.contains("added_tokens") && root["added_tokens"].is_array()
                             ? root["added_tokens"].size() : 0;
  const uint64_t id_limit = vocab.size() + n_added + 1024;
  auto check_id = [&](uint32_t id, const std::string& where) {
    if (id >= id_limit)
      j.fail(where + ": id " + std::to_string(id) + " is far beyond the " +
             std::to_string(vocab.size() + n_added) + " tokens in the file");
  };
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const uint32_t id = as_id(it.value(), "model.vocab[\"" + it.key() + "\"]", j);
    check_id(id, "model.vocab[\"" + it.key() + "\"]");
    if (id >= id_bytes.size()) id_bytes.resize(static_cast<size_t>(id) + 1);
    if (id_bytes[id])
      j.fail("model.vocab[\"" + it.key() + "\"]: id " + std::to_string(id) + " is used twice");
    std::optional<std::string> raw = unmap_bytes(it.key());
    // Like the ByteLevel decoder: a token outside the byte map decodes to its own UTF-8.
    id_bytes[id] = raw ? *raw : it.key();
    if (raw) m.vocab.emplace(*raw, id);  // others can never come out of byte-level input
    max_id = std::max<int64_t>(max_id, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string c;
    append_utf8(c, bm.to_char[b]);
    auto it = vocab.find(c);
    m.byte_id[b] = it == vocab.end() ? -1 : static_cast<int64_t>(it->get<uint32_t>());
  }

  const json& merges = j.field(model, "merges", "model");
  if (!merges.is_array()) j.fail("model.merges must be an array");
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string path = "model.merges[" + std::to_string(i) + "]";
    const json& mg = merges[i];
    // The library reads merges as all "a b" strings or all ["a", "b"] pairs, never a mixture.
    if (i > 0 && mg.is_string() != merges[0].is_string())
      j.fail(path + " is " + (mg.is_string() ? "a string" : "not a string") +
             " but model.merges[0] is " + (merges[0].is_string() ? "a string" : "not") +
             ": merges must be all \"a b\" strings or all [\"a\", \"b\"] pairs");
    std::string a, b;
    if (mg.is_string()) {
      const std::string s = mg.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        j.fail(path + " \"" + s + "\" must be two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
      a = mg[0].get<std::string>();
      b = mg[1].get<std::string>();
    } else {
      j.fail(path + " must be \"a b\" or [\"a\", \"b\"]");
    }
    auto id_of = [&](const std::string& t) {
      auto it = vocab.find(t);
      if (it == vocab.end()) j.fail(path + ": \"" + t + "\" is not in model.vocab");
      return it->get<uint32_t>();
    };
    const uint32_t ia = id_of(a), ib = id_of(b), inew = id_of(a + b);
    m.merges[pair_key(ia, ib)] = {static_cast<uint32_t>(i), inew};  // a repeat takes the later rank
  }

  // added_tokens, with the ids the library assigns: the vocab's id, else the next free one.
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& arr = root["added_tokens"];
    if (!arr.is_array()) j.fail("added_tokens must be an array");
    int64_t max_added = -1;
    for (size_t i = 0; i < arr.size(); ++i) {
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      const json& at = arr[i];
      AddedToken t;
      t.id = as_id(j.field(at, "id", path), path + ".id", j);
      check_id(t.id, path + ".id");
      t.content = j.str(at, "content", path);
      if (t.content.empty()) j.fail(path + ".content must not be empty");
      if (!is_valid_utf8(t.content)) j.fail(path + ".content is not valid UTF-8");
      if (j.boolean(at, "single_word", path, false))
        j.fail(path + ".single_word true is not supported (supported: false)");
      t.lstrip = j.boolean(at, "lstrip", path, false);
      t.rstrip = j.boolean(at, "rstrip", path, false);
      j.field(at, "normalized", path);
      j.field(at, "special", path);
      t.normalized = j.boolean(at, "normalized", path, false);
      t.special = j.boolean(at, "special", path, false);
      if (m.added_by_content.count(t.content))
        j.fail(path + ".content \"" + t.content + "\" appears twice");
      uint32_t expect;
      auto v = vocab.find(t.content);
      const auto n_vocab = static_cast<int64_t>(vocab.size());
      if (v != vocab.end()) expect = v->get<uint32_t>();
      else if (max_added < 0) expect = static_cast<uint32_t>(n_vocab);
      else expect = static_cast<uint32_t>(max_added >= n_vocab || n_vocab == 0 ? max_added + 1 : n_vocab);
      if (t.id != expect)
        j.fail(path + ".id " + std::to_string(t.id) + " differs from the id the library gives \"" +
               t.content + "\": " + std::to_string(expect));
      max_added = std::max<int64_t>(max_added, t.id);
      max_id = std::max<int64_t>(max_id, t.id);
      m.added_by_content[t.content] = t.id;
      m.added.push_back(std::move(t));
    }
    for (const AddedToken& t : m.added) {
      if (t.id >= id_bytes.size()) id_bytes.resize(static_cast<size_t>(t.id) + 1);
      id_bytes[t.id] = t.content;
      AddedPass& pass = t.normalized ? m.pass_normalized : m.pass_raw;
      pass.by_first[static_cast<unsigned char>(t.content[0])].push_back(&t);
      pass.empty = false;
    }
    for (AddedPass* pass : {&m.pass_raw, &m.pass_normalized})
      for (auto& list : pass->by_first)  // longest first: leftmost-longest matching
        std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) {
          return a->content.size() > b->content.size();
        });
  }
  if (max_id < 0) j.fail("model.vocab is empty");
  vocab_size_ = static_cast<uint32_t>(max_id + 1);
}

HfTokenizer::~HfTokenizer() = default;

std::unique_ptr<HfTokenizer> HfTokenizer::from_file(const std::string& path) {
  return std::make_unique<HfTokenizer>(read_tokenizer_file(path), path);
}

std::vector<uint32_t> HfTokenizer::encode(std::string_view text) const {
  const Impl& m = *impl_;
  std::string fixed;
  if (!is_valid_utf8(text)) {
    fixed = replace_invalid_utf8(text);
    text = fixed;
  }
  ThreadState& ts = m.thread_state();
  std::vector<Segment> segs, segs2;
  if (m.pass_raw.empty) segs.push_back({false, 0, 0, text.size()});
  else m.split_added(text, 0, m.pass_raw, segs);
  if (!m.pass_normalized.empty) {
    for (const Segment& s : segs) {
      if (s.is_token) segs2.push_back(s);
      else m.split_added(text.substr(s.begin, s.end - s.begin), s.begin, m.pass_normalized, segs2);
    }
    segs.swap(segs2);
  }
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 1);
  for (const Segment& s : segs) {
    if (s.is_token) out.push_back(s.id);
    else m.pretokenize(0, text.substr(s.begin, s.end - s.begin), ts, out);
  }
  return out;
}

std::string HfTokenizer::decode(const std::vector<uint32_t>& tokens) const {
  std::string out;
  for (uint32_t t : tokens) {
    if (t >= impl_->id_bytes.size() || !impl_->id_bytes[t])
      throw std::invalid_argument(impl_->name + ": token id " + std::to_string(t) +
                                  " is not in the vocabulary");
    out += *impl_->id_bytes[t];
  }
  return out;
}

void HfTokenizer::save(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << json_text_;
  if (!out) throw std::runtime_error("tokenizer " + path + ": cannot write");
}

std::optional<uint32_t> HfTokenizer::special_token(std::string_view content) const {
  auto it = impl_->added_by_content.find(std::string(content));
  if (it == impl_->added_by_content.end()) return std::nullopt;
  return it->second;
}

}  // namespace mod::data
