// Byte and byte-level BPE tokenizers. BPE training keeps pair counts incrementally and a lazy
// max-heap of (count, pair), so each merge touches only the words that contain its pair.
#include "train/data/tokenizer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "train/data/hf_tokenizer.h"

namespace mod::data {

namespace {
uint64_t pair_key(uint32_t a, uint32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }

enum class CharClass { Space, Letter, Digit, Other };
CharClass classify(unsigned char c) {
  if (std::isspace(c)) return CharClass::Space;
  if (std::isalpha(c) || c >= 0x80) return CharClass::Letter;  // UTF-8 bytes join words
  if (std::isdigit(c)) return CharClass::Digit;
  return CharClass::Other;
}

// Byte lengths of BPE tokens as merges make them, kept within kMaxTokenBytes and kMaxVocabBytes.
class TokenLengths {
 public:
  // Why merging tokens l and r breaks a bound, or "" when it does not.
  std::string breaks_bound(uint32_t l, uint32_t r) const {
    const uint64_t n = uint64_t{len_[l]} + len_[r];
    if (n > kMaxTokenBytes)
      return "makes a token of " + std::to_string(n) + " bytes (at most " +
             std::to_string(kMaxTokenBytes) + ")";
    if (total_ + n > kMaxVocabBytes)
      return "makes the tokens' bytes exceed " + std::to_string(kMaxVocabBytes >> 20) +
             " MiB in all";
    return "";
  }
  void add(uint32_t l, uint32_t r) {
    len_.push_back(len_[l] + len_[r]);
    total_ += len_.back();
  }

 private:
  std::vector<uint32_t> len_ = std::vector<uint32_t>(256, 1);
  uint64_t total_ = 256;
};

void write_file(const std::string& path, const std::string& body) {
  std::ofstream out(path, std::ios::trunc);
  out << body;
  if (!out) throw std::runtime_error("tokenizer " + path + ": cannot write");
}
}  // namespace

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    // A single space attaches to the following non-space run (" word").
    if (text[i] == ' ' && i + 1 < text.size() && classify(text[i + 1]) != CharClass::Space) ++i;
    const CharClass cls = classify(static_cast<unsigned char>(text[i]));
    ++i;
    while (i < text.size() && classify(static_cast<unsigned char>(text[i])) == cls) {
      // Leave a space that precedes a word for that word.
      if (cls == CharClass::Space && text[i] == ' ' && i + 1 < text.size() &&
          classify(static_cast<unsigned char>(text[i + 1])) != CharClass::Space)
        break;
      ++i;
    }
    out.push_back(text.substr(start, i - start));
  }
  return out;
}

// --- byte ---

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(const std::vector<uint32_t>& tokens) const {
  std::string out;
  out.reserve(tokens.size());
  for (uint32_t t : tokens) {
    if (t >= 256) throw std::invalid_argument("byte tokenizer: token " + std::to_string(t) + " >= 256");
    out.push_back(static_cast<char>(t));
  }
  return out;
}

void ByteTokenizer::save(const std::string& path) const {
  write_file(path, "modtrain-tokenizer 1\nkind byte\nvocab_size 256\nmerges 0\n");
}

// --- BPE ---

BpeTokenizer::BpeTokenizer(std::vector<std::pair<uint32_t, uint32_t>> merges)
    : merges_(std::move(merges)) {
  TokenLengths lengths;  // checked before bytes_ grows: a doubling chain asks for 2^merges bytes
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [l, r] = merges_[i];
    const uint32_t id = 256 + static_cast<uint32_t>(i);
    if (l >= id || r >= id)
      throw std::invalid_argument("bpe: merge " + std::to_string(i) + " (" + std::to_string(l) +
                                  ", " + std::to_string(r) + ") refers to a later token");
    const std::string broken = lengths.breaks_bound(l, r);
    if (!broken.empty())
      throw std::invalid_argument("bpe: merge " + std::to_string(i) + " (" + std::to_string(l) +
                                  ", " + std::to_string(r) + ") " + broken);
    lengths.add(l, r);
  }
  bytes_.resize(256 + merges_.size());
  for (uint32_t b = 0; b < 256; ++b) bytes_[b] = std::string(1, static_cast<char>(b));
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [l, r] = merges_[i];
    const uint32_t id = 256 + static_cast<uint32_t>(i);
    bytes_[id] = bytes_[l] + bytes_[r];
    rank_[pair_key(l, r)] = static_cast<uint32_t>(i);
  }
}

BpeTokenizer BpeTokenizer::train(std::string_view text, uint32_t vocab_size) {
  if (vocab_size < 256) throw std::invalid_argument("bpe: vocab_size must be >= 256");
  std::unordered_map<std::string_view, int64_t> word_counts;
  for (std::string_view w : pretokenize(text)) ++word_counts[w];
  std::vector<std::vector<uint32_t>> words;
  std::vector<int64_t> counts;
  for (const auto& [w, c] : word_counts) {
    if (w.size() < 2) continue;  // nothing to merge
    words.emplace_back(w.begin(), w.end());
    for (auto& s : words.back()) s &= 0xFF;
    counts.push_back(c);
  }

  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::unordered_set<uint32_t>> where;
  auto add_pairs = [&](uint32_t wi, int64_t sign) {
    const auto& s = words[wi];
    for (size_t j = 0; j + 1 < s.size(); ++j) {
      const uint64_t k = pair_key(s[j], s[j + 1]);
      pair_counts[k] += sign * counts[wi];
      if (sign > 0) where[k].insert(wi);
    }
  };
  for (uint32_t wi = 0; wi < words.size(); ++wi) add_pairs(wi, +1);

  // Max-heap on count; ties go to the smaller pair key so training is deterministic.
  using Entry = std::pair<int64_t, uint64_t>;
  auto cmp = [](const Entry& a, const Entry& b) {
    return a.first != b.first ? a.first < b.first : a.second > b.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  for (const auto& [k, c] : pair_counts) heap.push({c, k});

  std::vector<std::pair<uint32_t, uint32_t>> merges;
  TokenLengths lengths;
  while (256 + merges.size() < vocab_size && !heap.empty()) {
    const auto [count, key] = heap.top();
    heap.pop();
    auto it = pair_counts.find(key);
    if (it == pair_counts.end() || it->second != count) continue;  // stale entry
    if (count < 2) break;                                           // nothing worth merging
    const uint32_t left = static_cast<uint32_t>(key >> 32), right = static_cast<uint32_t>(key);
    if (!lengths.breaks_bound(left, right).empty()) continue;  // never learned: too long to load
    lengths.add(left, right);
    const uint32_t id = 256 + static_cast<uint32_t>(merges.size());
    merges.emplace_back(left, right);
    std::vector<uint32_t> touched(where[key].begin(), where[key].end());
    std::unordered_set<uint64_t> changed;
    for (uint32_t wi : touched) {
      add_pairs(wi, -1);
      auto& s = words[wi];
      for (size_t j = 0; j + 1 < s.size(); ++j) changed.insert(pair_key(s[j], s[j + 1]));
      std::vector<uint32_t> merged;
      merged.reserve(s.size());
      for (size_t j = 0; j < s.size(); ++j) {
        if (j + 1 < s.size() && s[j] == left && s[j + 1] == right) {
          merged.push_back(id);
          ++j;
        } else {
          merged.push_back(s[j]);
        }
      }
      s = std::move(merged);
      add_pairs(wi, +1);
      for (size_t j = 0; j + 1 < s.size(); ++j) changed.insert(pair_key(s[j], s[j + 1]));
    }
    pair_counts.erase(key);
    where.erase(key);
    for (uint64_t k : changed) {
      auto pc = pair_counts.find(k);
      if (pc != pair_counts.end() && pc->second > 0) heap.push({pc->second, k});
    }
  }
  return BpeTokenizer(std::move(merges));
}

std::vector<uint32_t> BpeTokenizer::encode_word(std::string_view word) const {
  std::vector<uint32_t> s(word.begin(), word.end());
  for (auto& v : s) v &= 0xFF;
  while (s.size() > 1) {
    uint32_t best_rank = UINT32_MAX;
    size_t best = 0;
    for (size_t j = 0; j + 1 < s.size(); ++j) {
      auto it = rank_.find(pair_key(s[j], s[j + 1]));
      if (it != rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = j;
      }
    }
    if (best_rank == UINT32_MAX) break;
    const auto [l, r] = merges_[best_rank];
    std::vector<uint32_t> merged;
    merged.reserve(s.size());
    for (size_t j = 0; j < s.size(); ++j) {
      if (j >= best && j + 1 < s.size() && s[j] == l && s[j + 1] == r) {
        merged.push_back(256 + best_rank);
        ++j;
      } else {
        merged.push_back(s[j]);
      }
    }
    s = std::move(merged);
  }
  return s;
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text) const {
  std::unordered_map<std::string_view, std::vector<uint32_t>> cache;
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3);
  for (std::string_view w : pretokenize(text)) {
    auto it = cache.find(w);
    if (it == cache.end()) it = cache.emplace(w, encode_word(w)).first;
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<uint32_t>& tokens) const {
  std::string out;
  for (uint32_t t : tokens) {
    if (t >= bytes_.size())
      throw std::invalid_argument("bpe tokenizer: token " + std::to_string(t) +
                                  " outside the vocabulary of " + std::to_string(bytes_.size()));
    out += bytes_[t];
  }
  return out;
}

void BpeTokenizer::save(const std::string& path) const {
  std::ostringstream os;
  os << "modtrain-tokenizer 1\nkind bpe\nvocab_size " << vocab_size() << "\nmerges "
     << merges_.size() << "\n";
  for (const auto& [l, r] : merges_) os << l << " " << r << "\n";
  write_file(path, os.str());
}

std::string read_tokenizer_file(const std::string& path) {
  const auto fail = [&](const std::string& what) {
    return std::runtime_error("tokenizer " + path + ": " + what);
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer before it is refused.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw fail(std::string("cannot open: ") + std::strerror(errno));
  std::string bytes;
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (regular && static_cast<uint64_t>(st.st_size) <= kMaxTokenizerFileBytes) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    bytes.resize(done);
  }
  ::close(fd);
  const std::string bound = std::to_string(kMaxTokenizerFileBytes >> 20) + " MiB";
  if (!regular)
    throw fail("not a regular file (a tokenizer is read whole, from a file of at most " + bound +
               ")");
  if (static_cast<uint64_t>(st.st_size) > kMaxTokenizerFileBytes)
    throw fail(std::to_string(st.st_size) + " bytes, more than the " + bound +
               " a tokenizer file may have");
  if (bytes.size() != static_cast<size_t>(st.st_size))
    throw fail("read error or file changed while read");
  return bytes;
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  return parse(read_tokenizer_file(path), path);
}

std::unique_ptr<Tokenizer> Tokenizer::parse(std::string bytes, const std::string& path) {
  const bool json_name = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  const size_t first = bytes.find_first_not_of(" \t\n\v\f\r");
  if (json_name || (first != std::string::npos && bytes[first] == '{'))
    return std::make_unique<HfTokenizer>(std::move(bytes), path);
  return parse_text(bytes, path);
}

std::unique_ptr<Tokenizer> Tokenizer::parse_text(const std::string& text, const std::string& path) {
  size_t pos = 0, line_no = 0;
  auto fail = [&](const std::string& what) -> std::runtime_error {
    return std::runtime_error("tokenizer " + path + ": line " + std::to_string(line_no) + ": " + what);
  };
  // The next line split on single spaces; a stream parse would read "1 2 3" or "-1" as merges.
  auto next_line = [&](const std::string& expected) {
    ++line_no;
    if (pos >= text.size()) throw fail("expected '" + expected + "', got end of file");
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    std::vector<std::string> words;
    for (size_t b = 0; b <= line.size();) {
      const size_t e = std::min(line.find(' ', b), line.size());
      words.push_back(line.substr(b, e - b));
      b = e + 1;
    }
    if (words.size() != 2 || words[0].empty() || words[1].empty())
      throw fail("expected '" + expected + "', got '" + line.substr(0, 80) + "'");
    return words;
  };
  auto number = [&](const std::string& w, uint64_t max, const std::string& what) {
    if (w.size() > 10 || w.find_first_not_of("0123456789") != std::string::npos ||
        (w.size() > 1 && w[0] == '0') || std::stoull(w) > max)
      throw fail(what + " '" + w.substr(0, 20) + "' is not a number in [0, " +
                 std::to_string(max) + "]");
    return std::stoull(w);
  };
  auto keyed = [&](const std::string& key) {
    const auto w = next_line(key + " <value>");
    if (w[0] != key) throw fail("expected '" + key + " <value>', got '" + w[0] + " " + w[1] + "'");
    return w[1];
  };
  if (keyed("modtrain-tokenizer") != "1") throw fail("unsupported version (this build reads 1)");
  const std::string kind = keyed("kind");
  if (kind != "byte" && kind != "bpe") throw fail("kind '" + kind + "', expected byte or bpe");
  // A vocabulary beyond 2^31 cannot be embedded (model.vocab_size is an int32).
  const uint64_t vocab = number(keyed("vocab_size"), uint64_t{1} << 31, "vocab_size");
  const uint64_t n = number(keyed("merges"), (uint64_t{1} << 31) - 256, "merges");
  if (kind == "byte" && (vocab != 256 || n != 0)) throw fail("a byte tokenizer has vocab 256, 0 merges");
  if (vocab != 256 + n)
    throw fail("vocab_size " + std::to_string(vocab) + " != 256 + merges " + std::to_string(n));
  // Each merge line is at least 4 bytes ("l r\n"): a count the text cannot hold is refused
  // before anything is reserved.
  if (n > (text.size() - std::min(pos, text.size())) / 4 + 1)
    throw fail("merges " + std::to_string(n) + " but the file has room for fewer lines");
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  merges.reserve(n);
  TokenLengths lengths;
  for (uint64_t i = 0; i < n; ++i) {
    const auto w = next_line("left right");
    const uint64_t limit = 256 + i - 1;  // a merge refers to earlier tokens only
    const auto l = static_cast<uint32_t>(number(w[0], limit, "merge left"));
    const auto r = static_cast<uint32_t>(number(w[1], limit, "merge right"));
    const std::string broken = lengths.breaks_bound(l, r);
    if (!broken.empty()) throw fail("merge " + w[0] + " " + w[1] + " " + broken);
    lengths.add(l, r);
    merges.emplace_back(l, r);
  }
  ++line_no;
  if (pos < text.size()) throw fail("unexpected text after the last line");
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  return std::make_unique<BpeTokenizer>(std::move(merges));
}

}  // namespace mod::data
