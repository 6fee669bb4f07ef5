// prep.state reading, writing and checking (see prep_state.h).
#include "train/data/prep_state.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string_view>

#include "core/util/crc32c.h"
#include "core/util/file_io.h"

namespace mod::data {

namespace {
constexpr std::string_view kStateMagic = "modtrain-prep-state 2";
constexpr std::string_view kSealPrefix = "crc32c ";
constexpr const char* kStartOver = " (delete the directory to start over)";

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what + kStartOver);
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "%08" PRIx32, v);
  return b;
}

std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> out;
  for (size_t at = 0; at <= line.size();) {
    const size_t space = std::min(line.find(' ', at), line.size());
    out.push_back(line.substr(at, space - at));
    at = space + 1;
  }
  return out;
}

// A whole field of decimal (or hex) digits, nothing else: no sign, no spaces, no overflow.
template <typename T>
bool parse_number(std::string_view s, T& out, int base = 10) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}
}  // namespace

std::string prep_shard_name(int split, uint64_t index) {
  char b[64];
  std::snprintf(b, sizeof b, "%s_%06" PRIu64 ".bin", kSplitNames[split], index);
  return b;
}

std::string prep_state_text(const PrepState& s) {
  std::string o = std::string(kStateMagic) + "\n";
  for (const auto& [k, v] : s.fingerprint) o += "option\t" + k + "\t" + v + "\n";
  o += "position " + std::to_string(s.next.input) + " " + std::to_string(s.next.offset) + " " +
       std::to_string(s.next.document) + " " + std::to_string(s.next.line) + " " +
       hex32(s.next_tail_crc) + "\n";
  o += "documents " + std::to_string(s.documents) + " " + std::to_string(s.val_documents) + " " +
       std::to_string(s.text_bytes) + "\n";
  for (int i = 0; i < 2; ++i) {
    const auto& p = s.split[i];
    o += "split " + std::to_string(i) + " " + std::to_string(p.index) + " " +
         std::to_string(p.partial) + " " + std::to_string(p.tokens) + " " +
         std::to_string(p.documents) + "\n";
    for (const auto& d : p.done)
      o += "shard " + std::to_string(i) + " " + d.name + " " + std::to_string(d.tokens) + " " +
           std::to_string(d.crc) + "\n";
  }
  o += "end\n";
  return o + std::string(kSealPrefix) + hex32(crc32c(o.data(), o.size())) + "\n";
}

PrepState parse_prep_state(const std::string& text, const std::string& where) {
  // The seal first: the last line, over every byte before it.
  const size_t seal_at = text.size() > 1 ? text.rfind('\n', text.size() - 2) + 1 : 0;
  const std::string_view seal = std::string_view(text).substr(seal_at);
  uint32_t sealed = 0;
  if (text.empty() || text.back() != '\n' || seal.substr(0, kSealPrefix.size()) != kSealPrefix ||
      !parse_number(seal.substr(kSealPrefix.size(), seal.size() - kSealPrefix.size() - 1), sealed,
                    16))
    fail(where, text.rfind("modtrain-prep-state 1\n", 0) == 0
                    ? "written by an older modtrain (format 1, unsealed); it cannot be resumed"
                    : "not a sealed prep state (no crc32c line last: truncated or not one)");
  if (crc32c(text.data(), seal_at) != sealed)
    fail(where, "checksum mismatch (the file was changed or damaged since prep wrote it)");

  PrepState s;
  bool ended = false;
  int line_no = 0;
  for (size_t at = 0; at < seal_at;) {
    const size_t nl = text.find('\n', at);
    const std::string_view line(text.data() + at, nl - at);
    at = nl + 1;
    ++line_no;
    const std::string here = where + ":" + std::to_string(line_no);
    auto bad = [&](const std::string& why) { fail(here, why); };
    if (ended) bad("a line after 'end'");
    if (line_no == 1) {
      if (line != kStateMagic)
        bad("not a prep state (expected '" + std::string(kStateMagic) + "')");
      continue;
    }
    if (line.substr(0, 7) == "option\t") {
      const size_t tab = line.find('\t', 7);
      if (tab == std::string_view::npos) bad("an option line without its value");
      s.fingerprint.emplace_back(line.substr(7, tab - 7), line.substr(tab + 1));
      continue;
    }
    const std::vector<std::string_view> f = fields_of(line);
    // The counts in fields first, first + 1, ... to the line's end.
    auto counts = [&](size_t first, std::initializer_list<uint64_t*> out) {
      if (f.size() != first + out.size())
        bad("'" + std::string(f[0]) + "' takes " + std::to_string(first - 1 + out.size()) +
            " fields");
      size_t k = first;
      for (uint64_t* o : out)
        if (!parse_number(f[k++], *o)) bad("'" + std::string(f[k - 1]) + "' is not a count");
    };
    auto split_of = [&](std::string_view v) -> PrepState::Split& {
      if (v != "0" && v != "1") bad("split '" + std::string(v) + "' is not 0 (train) or 1 (val)");
      return s.split[v == "1"];
    };
    if (f[0] == "position") {
      uint64_t input = 0;
      if (f.size() != 6) bad("'position' takes 5 fields");
      if (!parse_number(f[1], input) || input > UINT32_MAX || !parse_number(f[2], s.next.offset) ||
          !parse_number(f[3], s.next.document) || !parse_number(f[4], s.next.line) ||
          !parse_number(f[5], s.next_tail_crc, 16))
        bad("bad position '" + std::string(line) + "'");
      s.next.input = static_cast<uint32_t>(input);
    } else if (f[0] == "documents") {
      counts(1, {&s.documents, &s.val_documents, &s.text_bytes});
    } else if (f[0] == "split") {
      if (f.size() != 6) bad("'split' takes 5 fields");
      PrepState::Split& p = split_of(f[1]);
      counts(2, {&p.index, &p.partial, &p.tokens, &p.documents});
    } else if (f[0] == "shard") {
      if (f.size() != 5) bad("'shard' takes 4 fields");
      ShardRecord r{std::string(f[2]), 0, 0};
      if (!parse_number(f[3], r.tokens) || !parse_number(f[4], r.crc))
        bad("bad shard '" + std::string(line) + "'");
      split_of(f[1]).done.push_back(std::move(r));
    } else if (f[0] == "end" && f.size() == 1) {
      ended = true;
    } else {
      bad("unknown line '" + std::string(line.substr(0, 80)) + "'");
    }
  }
  if (!ended) fail(where, "no 'end' line");
  return s;
}

PrepState read_prep_state(const std::string& path) {
  return parse_prep_state(util::read_file(path), path);
}

void check_prep_state(const PrepState& s, const std::vector<InputInfo>& inputs,
                      uint64_t shard_tokens, const std::string& where) {
  auto bad = [&](const std::string& what) { fail(where, what); };
  for (int i = 0; i < 2; ++i) {
    const PrepState::Split& p = s.split[i];
    const std::string split = kSplitNames[i];
    if (p.done.size() != p.index)
      bad(split + ": " + std::to_string(p.done.size()) +
          " finished shards listed, but the split is at shard " + std::to_string(p.index));
    uint64_t tokens = p.partial;
    for (uint64_t k = 0; k < p.done.size(); ++k) {
      const ShardRecord& r = p.done[k];
      if (r.name != prep_shard_name(i, k))
        bad(split + " shard " + std::to_string(k) + " is named '" + r.name.substr(0, 80) +
            "', expected " + prep_shard_name(i, k) + " (a file prep writes in its directory)");
      if (r.tokens != shard_tokens)
        bad(r.name + ": " + std::to_string(r.tokens) +
            " tokens recorded; a finished shard holds "
            "--shard-tokens " +
            std::to_string(shard_tokens));
      if (tokens > UINT64_MAX - r.tokens) bad(split + ": its token counts overflow");
      tokens += r.tokens;
    }
    if (p.partial >= shard_tokens)
      bad(split + ": a partial shard of " + std::to_string(p.partial) +
          " tokens, at least "
          "--shard-tokens " +
          std::to_string(shard_tokens));
    if (p.tokens != tokens)
      bad(split + ": " + std::to_string(p.tokens) + " tokens recorded, its shards hold " +
          std::to_string(tokens));
  }
  if (s.documents != s.split[0].documents + s.split[1].documents ||
      s.val_documents != s.split[1].documents)
    bad("documents " + std::to_string(s.documents) + " (val " + std::to_string(s.val_documents) +
        ") do not add up to the splits' " + std::to_string(s.split[0].documents) + " + " +
        std::to_string(s.split[1].documents));
  const Position& p = s.next;
  if (p.input >= inputs.size())
    bad("position: input " + std::to_string(p.input) + " is past the " +
        std::to_string(inputs.size()) + " inputs");
  if (p.document > s.documents)
    bad("position: document " + std::to_string(p.document) + " of " + inputs[p.input].name +
        " is past the " + std::to_string(s.documents) + " documents done");
  const InputInfo& in = inputs[p.input];
  if (!in.seekable()) return;  // replayed by document count, which the replay checks
  if (p.offset > static_cast<uint64_t>(in.size) || (p.offset == 0) != (p.document == 0) ||
      p.line > p.offset)
    bad("position: offset " + std::to_string(p.offset) + " (document " +
        std::to_string(p.document) + ", line " + std::to_string(p.line) + ") does not fit " +
        in.name + " of " + std::to_string(in.size) + " bytes");
  if (input_tail_crc(in, p.offset) != s.next_tail_crc)
    bad("position: the bytes of " + in.name + " before offset " + std::to_string(p.offset) +
        " differ from those read before (the input changed, or the position was moved)");
}

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

}  // namespace mod::data
