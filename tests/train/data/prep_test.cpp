// Streaming prep against a reference computed here: every document encoded on its own, assigned
// by the split rule of prep.h, concatenated (with the end-of-text token where there is one) and
// cut every shard_tokens tokens. Also: threads and batches do not change a byte, a stopped prep
// resumes to the same bytes, a finished one is skipped, and errors name the option or file:line.
#include "train/data/prep.h"

#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "train/data/dataset.h"
#include "train/data/prep_state.h"
#include "train/data/text_source.h"
#include "train/data/token_file.h"
#include "train/data/tokenizer.h"

using namespace mod::data;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
struct Doc {
  std::string text;
  bool eot_after = true;
};

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("modtrain_prep_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Text of random words, with quotes, newlines and UTF-8 (JSON escapes them).
std::string random_text(std::mt19937& rng, size_t bytes) {
  static const char* words[] = {"the", "light", "and", "darkness", "\"said\"", "waters", "é", "\n",
                                "42", "firmament,", "day.", "  ", "God", "evening\n"};
  std::string s;
  while (s.size() < bytes) {
    s += words[rng() % 14];
    s += ' ';
  }
  return s;
}

std::string json_escape(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o + "\"";
}

// The documented plain-text rule: T = size / ceil(size / chunk); a document ends at the first
// line end at or after T bytes, or at 2T bytes.
std::vector<Doc> plain_docs(const std::string& text, size_t chunk) {
  std::vector<Doc> docs;
  if (text.empty()) return docs;
  const size_t n = (text.size() + chunk - 1) / chunk, t = (text.size() + n - 1) / n;
  for (size_t at = 0; at < text.size();) {
    size_t len = text.size() - at;
    if (len > t) {
      const size_t nl = text.find('\n', at + t - 1);
      len = nl != std::string::npos && nl < at + 2 * t ? nl - at + 1 : std::min(len, 2 * t);
    }
    docs.push_back({text.substr(at, len), at + len == text.size()});
    at += len;
  }
  return docs;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Expected shards of both splits: [0] train, [1] val.
std::array<std::vector<std::vector<uint32_t>>, 2> reference(const std::vector<Doc>& docs,
                                                            const Tokenizer& tok,
                                                            std::optional<uint32_t> eot,
                                                            const PrepOptions& o) {
  std::array<std::vector<uint32_t>, 2> stream;
  uint64_t val_docs = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    bool val = o.val_documents > 0 ? i < o.val_documents
                                   : static_cast<double>(splitmix64(o.seed + i)) < o.val_fraction * 0x1p64;
    if (o.val_documents == 0 && i + 1 == docs.size() && val_docs == 0) val = true;
    val_docs += val;
    const auto t = tok.encode(docs[i].text);
    stream[val].insert(stream[val].end(), t.begin(), t.end());
    if (eot && docs[i].eot_after) stream[val].push_back(*eot);
  }
  std::array<std::vector<std::vector<uint32_t>>, 2> shards;
  for (int s = 0; s < 2; ++s)
    for (size_t at = 0; at < stream[s].size(); at += o.shard_tokens)
      shards[s].emplace_back(stream[s].begin() + at,
                             stream[s].begin() + std::min<size_t>(stream[s].size(), at + o.shard_tokens));
  return shards;
}

// Every file of a finished prep directory, by name.
std::map<std::string, std::string> dir_bytes(const fs::path& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::directory_iterator(dir)) m[e.path().filename().string()] = read_bytes(e.path());
  return m;
}

void check_against_reference(const PrepOptions& o, const std::vector<Doc>& docs) {
  const modtrain::data::Manifest m = read_manifest(o.out + "/" + kManifestName);
  std::unique_ptr<Tokenizer> tok = Tokenizer::load(o.out + "/tokenizer.txt");
  REQUIRE(tok->kind() == o.tokenizer);
  CHECK(m.vocab_size() == tok->vocab_size());
  CHECK_FALSE(m.has_eot_token());  // byte and BPE have no special tokens
  const auto want = reference(docs, *tok, std::nullopt, o);
  const google::protobuf::RepeatedPtrField<modtrain::data::Shard>* got[2] = {&m.train(), &m.val()};
  for (int s = 0; s < 2; ++s) {
    REQUIRE(static_cast<size_t>(got[s]->size()) == want[s].size());
    for (size_t k = 0; k < want[s].size(); ++k) {
      const auto& sh = (*got[s])[static_cast<int>(k)];
      const TokenFile f = TokenFile::open(o.out + "/" + sh.path(), modtrain::data::MODTRAIN, 0);
      CHECK(sh.tokens() == want[s][k].size());
      CHECK(sh.crc32c() == f.full_crc());
      CHECK(read_all(f) == want[s][k]);
    }
  }
  CHECK(m.prep().documents() == docs.size());
  const Dataset d = Dataset::open(o.out);
  CHECK(d.train.files().size() == want[0].size());
  CHECK(!fs::exists(o.out + "/prep.state"));
}
}  // namespace

TEST_CASE("plain text documents are cut at line ends and give the file back", "[data]") {
  const fs::path dir = temp_dir("source");
  std::mt19937 rng(3);
  const std::string text = random_text(rng, 10000) + std::string(5000, 'x');  // a long line too
  const std::string path = write_file(dir / "a.txt", text);
  TextSource src({inspect_input(path)}, "text", 1024);
  Document d;
  std::string joined;
  size_t n = 0;
  const auto want = plain_docs(text, 1024);
  while (src.next(d)) {
    REQUIRE(n < want.size());
    CHECK(d.text == want[n].text);
    CHECK(d.eot_after == want[n].eot_after);
    joined += d.text;
    ++n;
  }
  CHECK(n == want.size());
  CHECK(joined == text);
  CHECK(d.last);
}

TEST_CASE("prep's shards equal a reference for text, JSONL and gzip'd JSONL, byte and BPE", "[data]") {
  const fs::path dir = temp_dir("reference");
  std::mt19937 rng(7);
  // Three plain-text files (one empty: no documents) and a JSON Lines corpus with a blank line.
  std::vector<std::string> texts = {random_text(rng, 9000), "", random_text(rng, 3000)};
  std::vector<std::string> plain_inputs;
  std::vector<Doc> plain;
  for (size_t i = 0; i < texts.size(); ++i) {
    plain_inputs.push_back(write_file(dir / ("t" + std::to_string(i) + ".txt"), texts[i]));
    for (auto& d : plain_docs(texts[i], 1024)) plain.push_back(d);
  }
  std::vector<Doc> jdocs;
  std::string jsonl;
  for (int i = 0; i < 60; ++i) {
    jdocs.push_back({random_text(rng, 50 + rng() % 400), true});
    jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": " + json_escape(jdocs.back().text) + "}\n";
    if (i == 10) jsonl += "\n";
  }
  const std::string jpath = write_file(dir / "c.jsonl", jsonl);
  write_file(dir / "c2.jsonl", jsonl);
  REQUIRE(std::system(("gzip -nf " + (dir / "c2.jsonl").string()).c_str()) == 0);
  const std::string gzpath = (dir / "c2.jsonl.gz").string();

  struct Case {
    const char* name;
    std::vector<std::string> inputs;
    const std::vector<Doc>* docs;
  };
  for (const Case& c : {Case{"text", plain_inputs, &plain}, Case{"jsonl", {jpath}, &jdocs},
                        Case{"jsonl.gz", {gzpath}, &jdocs}})
    for (const std::string tokenizer : {"byte", "bpe"}) {
      DYNAMIC_SECTION(c.name << " " << tokenizer) {
        PrepOptions o;
        o.inputs = c.inputs;
        o.tokenizer = tokenizer;
        o.vocab_size = 300;
        o.text_chunk_kb = 1;
        o.val_fraction = 0.2;
        o.shard_tokens = 1000;
        o.batch_bytes = 2000;  // many batches
        o.progress = false;
        o.threads = 1;
        o.out = (dir / (std::string(c.name) + tokenizer + "1")).string();
        const PrepResult r1 = prep(o);
        CHECK(r1.train.shards >= 3);
        CHECK(r1.val.documents >= 1);
        check_against_reference(o, *c.docs);
        o.threads = 4;
        o.batch_bytes = 700;
        o.out = (dir / (std::string(c.name) + tokenizer + "4")).string();
        prep(o);
        CHECK(dir_bytes(o.out) == dir_bytes(dir / (std::string(c.name) + tokenizer + "1")));
        if (tokenizer == "bpe") {  // trained on the training documents only
          std::string sample;
          for (size_t i = 0; i < c.docs->size(); ++i) {
            if (static_cast<double>(splitmix64(o.seed + i)) < o.val_fraction * 0x1p64) continue;
            sample += (*c.docs)[i].text;
            if ((*c.docs)[i].eot_after) sample += '\n';
          }
          const auto loaded = Tokenizer::load(o.out + "/tokenizer.txt");
          CHECK(dynamic_cast<const BpeTokenizer&>(*loaded).merges() ==
                BpeTokenizer::train(sample, 300).merges());
        }
      }
    }
}

TEST_CASE("prep holds out the first N documents, or a tiny corpus's last one", "[data]") {
  const fs::path dir = temp_dir("split");
  std::vector<Doc> docs;
  std::string jsonl;
  for (int i = 0; i < 4; ++i) {
    docs.push_back({"document " + std::to_string(i), true});
    jsonl += "{\"text\": \"document " + std::to_string(i) + "\"}\n";
  }
  PrepOptions o;
  o.inputs = {write_file(dir / "d.jsonl", jsonl)};
  o.progress = false;
  o.val_documents = 2;
  o.out = (dir / "first").string();
  const PrepResult r = prep(o);
  CHECK(r.val.documents == 2);
  check_against_reference(o, docs);
  o.val_documents = 0;
  o.val_fraction = 1e-9;  // selects nothing: the last document is held out
  o.out = (dir / "tail").string();
  const PrepResult t = prep(o);
  CHECK(t.val.documents == 1);
  CHECK(t.val.tokens == docs.back().text.size());
  check_against_reference(o, docs);
}

TEST_CASE("a stopped prep resumes to the same bytes, and a finished one is skipped", "[data]") {
  const fs::path dir = temp_dir("resume");
  std::mt19937 rng(11);
  std::string jsonl;
  for (int i = 0; i < 200; ++i) jsonl += "{\"text\": " + json_escape(random_text(rng, 100 + rng() % 300)) + "}\n";
  PrepOptions o;
  write_file(dir / "g.jsonl", jsonl);  // gzip: resumed by replaying its documents
  REQUIRE(std::system(("gzip -nf " + (dir / "g.jsonl").string()).c_str()) == 0);
  o.inputs = {write_file(dir / "r.jsonl", jsonl), (dir / "g.jsonl.gz").string(),
              write_file(dir / "r.txt", random_text(rng, 20000))};
  o.tokenizer = "bpe";
  o.vocab_size = 320;
  o.text_chunk_kb = 2;
  o.val_fraction = 0.1;
  o.shard_tokens = 1500;
  o.batch_bytes = 1500;
  o.threads = 2;
  o.progress = false;
  o.out = (dir / "whole").string();
  prep(o);
  const auto whole = dir_bytes(o.out);

  o.out = (dir / "stopped").string();
  o.stop_after_batches = 5;
  int runs = 0;
  for (PrepResult r;; ++runs) {
    r = prep(o);
    if (!r.stopped) break;
    CHECK(fs::exists(o.out + "/prep.state"));
    CHECK_FALSE(fs::exists(o.out + "/" + kManifestName));
    // What a kill -9 leaves: tokens written after the resume point, cut back on resume.
    for (const auto& e : fs::directory_iterator(o.out))
      if (e.path().extension() == ".partial") std::ofstream(e.path(), std::ios::app) << "garbage!";
    if (runs == 2) {  // other options are refused, naming the option
      PrepOptions other = o;
      other.shard_tokens = 2000;
      CHECK_THROWS_WITH(prep(other), Contains("--shard-tokens was 1500, is now 2000"));
    }
    REQUIRE(runs < 100);
  }
  CHECK(runs > 3);
  CHECK(dir_bytes(o.out) == whole);
  o.stop_after_batches = 0;
  const PrepResult again = prep(o);
  CHECK(again.already_prepared);
  CHECK(again.train.tokens > 0);
  CHECK(dir_bytes(o.out) == whole);
  PrepOptions other = o;
  other.seed = 2;
  CHECK_THROWS_WITH(prep(other), Contains("already holds a dataset"));
}

TEST_CASE("prep's errors name the option, or the file and line", "[data]") {
  const fs::path dir = temp_dir("errors");
  PrepOptions o;
  o.progress = false;
  o.inputs = {write_file(dir / "ok.txt", "some text\n")};
  int n = 0;  // a new directory for each case: a failed prep leaves its state behind
  const auto fresh = [&](PrepOptions& p) -> PrepOptions& {
    p.out = (dir / ("out" + std::to_string(n++))).string();
    return p;
  };
  o.val_fraction = 0.6;
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("--val-fraction"));
  o.val_fraction = 0.05;
  o.tokenizer = "words";
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("--tokenizer words"));
  o.tokenizer = "byte";
  o.shard_tokens = 0;
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("--shard-tokens"));
  o.shard_tokens = 1000;
  o.eot = "<|endoftext|>";
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("--eot") && Contains("byte tokenizer has no special tokens"));
  o.eot.clear();
  o.inputs.clear();
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("no text"));
  o.inputs = {"-"};
  o.tokenizer = "bpe";
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("--input -: BPE"));
  o.tokenizer = "byte";

  o.inputs = {(dir / "missing.txt").string()};
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("missing.txt") && Contains("cannot open"));
  o.inputs = {write_file(dir / "bad.jsonl", "{\"text\": \"a\"}\n\n{\"text\": oops}\n")};
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("bad.jsonl:3: not JSON"));
  o.inputs = {write_file(dir / "field.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n")};
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("field.jsonl:2: no string field \"text\""));
  o.inputs = {write_file(dir / "corrupt.jsonl.gz", std::string("\x1f\x8b\x08\x00garbage, not deflate", 24))};
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("corrupt.jsonl.gz") && Contains("gzip"));
  // One damaged magic byte: zlib would pass the compressed bytes through as text.
  const fs::path damaged = dir / "damaged.txt";
  write_file(damaged, "a document that is long enough to compress\n");
  REQUIRE(std::system(("gzip -nf " + damaged.string()).c_str()) == 0);
  std::string gz = read_bytes(dir / "damaged.txt.gz");
  gz[1] = '\x8c';
  o.inputs = {write_file(dir / "damaged.txt.gz", gz), write_file(dir / "more.txt", "more text\n")};
  CHECK_THROWS_WITH(prep(fresh(o)), Contains("damaged.txt.gz: not gzip data"));
  o.inputs = {write_file(dir / "one.jsonl", "{\"text\": \"a\"}\n")};
  CHECK_THROWS_WITH(prep(fresh(o)),
                    Contains("the input " + o.inputs[0] + " hold 1 documents: too few"));
}

// The oracle of prep.h's invariant: stopped after any batch (the first to the last) and
// resumed, prep writes the bytes of an uninterrupted run, over seekable and replayed inputs.
TEST_CASE("a prep stopped after any batch resumes to the bytes of an uninterrupted one", "[data]") {
  const fs::path dir = temp_dir("every_stop");
  std::mt19937 rng(17);
  std::string jsonl;
  for (int i = 0; i < 40; ++i)
    jsonl += "{\"text\": " + json_escape(random_text(rng, 50 + rng() % 250)) + "}\n";
  write_file(dir / "g.jsonl", jsonl);
  REQUIRE(std::system(("gzip -nf " + (dir / "g.jsonl").string()).c_str()) == 0);
  PrepOptions o;
  o.inputs = {write_file(dir / "a.txt", random_text(rng, 6000)), (dir / "g.jsonl.gz").string(),
              write_file(dir / "b.jsonl", jsonl)};
  o.text_chunk_kb = 1;
  o.val_fraction = 0.2;
  o.shard_tokens = 900;
  o.batch_bytes = 700;
  o.threads = 2;
  o.progress = false;
  o.out = (dir / "whole").string();
  REQUIRE_FALSE(prep(o).stopped);
  const auto whole = dir_bytes(o.out);
  int stops = 0;
  for (size_t k = 1;; ++k) {
    INFO("stopped after batch " << k);
    o.out = (dir / ("stop" + std::to_string(k))).string();
    o.stop_after_batches = k;
    if (!prep(o).stopped) break;
    ++stops;
    o.stop_after_batches = 0;
    const PrepResult r = prep(o);
    CHECK(r.resumed);
    CHECK(dir_bytes(o.out) == whole);
    fs::remove_all(o.out);
    REQUIRE(k < 200);
  }
  CHECK(stops >= 15);
}

// Nothing in prep.state is trusted as written: a hand-edited (even resealed) or damaged state,
// a changed finished shard or a changed input is refused before the directory changes, naming
// the file and what does not fit. Each edit here once resumed with exit 0 to a wrong dataset.
TEST_CASE("a stopped prep's state, shards and inputs are checked before it resumes", "[data]") {
  const fs::path dir = temp_dir("tamper");
  std::mt19937 rng(5);
  std::string jsonl;
  for (int i = 0; i < 120; ++i)
    jsonl += "{\"text\": " + json_escape(random_text(rng, 100 + rng() % 200)) + "}\n";
  PrepOptions o;
  const std::string input = write_file(dir / "c.jsonl", jsonl);
  o.inputs = {input};
  o.shard_tokens = 400;
  o.batch_bytes = 400;
  o.threads = 1;
  o.val_fraction = 0.1;
  o.progress = false;
  o.out = (dir / "whole").string();
  prep(o);
  const auto whole = dir_bytes(o.out);
  o.out = (dir / "stopped").string();
  o.stop_after_batches = 12;
  REQUIRE(prep(o).stopped);
  o.stop_after_batches = 0;
  const std::string state_path = o.out + "/prep.state";
  const std::string sealed = read_bytes(state_path);
  const PrepState st = parse_prep_state(sealed, state_path);
  REQUIRE(st.split[0].done.size() >= 2);
  REQUIRE(st.next.offset > 100);
  auto before = dir_bytes(o.out);
  before.erase("prep.state");

  const auto refused = [&](const std::string& what, const std::string& state_text,
                           const std::string& expected) {
    INFO(what);
    write_file(state_path, state_text);
    CHECK_THROWS_WITH(prep(o), Contains(expected));
    auto now = dir_bytes(o.out);
    now.erase("prep.state");
    CHECK(now == before);
  };
  const auto resealed = [&](const std::function<void(PrepState&)>& edit) {
    PrepState s = st;
    edit(s);
    return prep_state_text(s);
  };
  const std::string at = state_path + ": ";
  refused("an input index past the end", resealed([](PrepState& s) { s.next.input = 1; }),
          at + "position: input 1 is past the 1 inputs");
  refused(
      "an offset moved back", resealed([](PrepState& s) { s.next.offset -= 100; }),
      "before offset " + std::to_string(st.next.offset - 100) + " differ from those read before");
  refused("an offset past the input", resealed([](PrepState& s) { s.next.offset += 1000000; }),
          at + "position: offset");
  refused("a changed shard CRC", resealed([](PrepState& s) { s.split[0].done[1].crc ^= 1; }),
          o.out + "/train_000001.bin: 400 tokens, CRC-32C");
  refused("a changed shard token count",
          resealed([](PrepState& s) { s.split[0].done[0].tokens = 399; }),
          at + "train_000000.bin: 399 tokens recorded");
  refused("a changed split token count", resealed([](PrepState& s) { s.split[0].tokens += 1; }),
          at + "train: " + std::to_string(st.split[0].tokens + 1) + " tokens recorded");
  refused("a removed shard line", resealed([](PrepState& s) { s.split[0].done.pop_back(); }),
          at + "train: " + std::to_string(st.split[0].done.size() - 1) + " finished shards listed");
  refused("a shard outside the directory",
          resealed([](PrepState& s) { s.split[0].done[0].name = "/etc/passwd"; }),
          at + "train shard 0 is named '/etc/passwd', expected train_000000.bin");
  refused("a val shard named as a train shard", resealed([](PrepState& s) {
            if (s.split[1].done.empty()) {
              s.split[1].done.push_back({"", 400, 0});
              s.split[1].index += 1;
              s.split[1].tokens += 400;
            }
            s.split[1].done[0].name = "train_000000.bin";
          }),
          at + "val shard 0 is named 'train_000000.bin', expected val_000000.bin");
  refused("documents that do not add up", resealed([](PrepState& s) { s.documents += 1; }),
          at + "documents " + std::to_string(st.documents + 1));
  std::string edited = sealed;
  edited[edited.find("position ") + 9] ^= 1;
  refused("an edit, not resealed", edited, at + "checksum mismatch");
  refused("a truncated state", sealed.substr(0, sealed.size() / 2), at + "not a sealed prep state");
  refused("a state of the unsealed format 1", "modtrain-prep-state 1\nend\n",
          at + "written by an older modtrain");
  write_file(state_path, sealed);

  // A finished shard changed on disk (same size), and the input changed before the position.
  const std::string shard = o.out + "/train_000000.bin", shard_bytes = read_bytes(shard);
  std::string flipped = shard_bytes;
  flipped[flipped.size() - 2] ^= 1;  // a token's low byte: still inside the vocabulary
  write_file(shard, flipped);
  before["train_000000.bin"] = flipped;
  refused("a changed shard", sealed, o.out + "/train_000000.bin: 400 tokens, CRC-32C");
  write_file(shard, shard_bytes);
  before["train_000000.bin"] = shard_bytes;
  std::string changed_input = jsonl;
  changed_input[st.next.offset - 3] = changed_input[st.next.offset - 3] == 'a' ? 'b' : 'a';
  write_file(input, changed_input);
  refused("an input changed in place", sealed, "the bytes of " + input + " before offset");
  write_file(input, jsonl);

  write_file(state_path, sealed);  // intact: it resumes to the uninterrupted bytes
  CHECK(prep(o).resumed);
  CHECK(dir_bytes(o.out) == whole);
}

TEST_CASE("prep indexes nanoGPT token files in place", "[data]") {
  const fs::path dir = temp_dir("index");
  const auto raw = [&](const std::string& name, uint16_t n) {  // nanoGPT: bare uint16 tokens
    std::string bytes;
    for (uint16_t t = 0; t < n; ++t) bytes.append(reinterpret_cast<const char*>(&t), 2);
    return write_file(dir / name, bytes);
  };
  IndexOptions x;
  x.out = (dir / "ds").string();
  x.format = "nanogpt";
  x.train_shards = {raw("train_a.bin", 200), raw("train_b.bin", 100)};
  x.val_shards = {raw("val.bin", 50)};
  CHECK_THROWS_WITH(index_prep(x), Contains("--vocab-size"));
  x.vocab_size = 300;
  const std::string manifest = index_prep(x);
  const Dataset d = Dataset::open(x.out);
  CHECK(d.train.tokens() == 300);
  CHECK(d.val.tokens() == 50);
  CHECK(read_manifest(manifest).train(0).path() == fs::absolute(dir / "train_a.bin").string());
  x.format = "parquet";
  CHECK_THROWS_WITH(index_prep(x), Contains("--format parquet"));
}
