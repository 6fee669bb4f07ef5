// Byte and byte-level BPE tokenizers. BPE training keeps pair counts incrementally and a lazy
// max-heap of (count, pair), so each merge touches only the words that contain its pair.
#include "train/data/tokenizer.h"

#include "train/data/hf_tokenizer.h"

#include <cctype>
#include <fstream>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

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
  bytes_.resize(256 + merges_.size());
  for (uint32_t b = 0; b < 256; ++b) bytes_[b] = std::string(1, static_cast<char>(b));
  for (size_t i = 0; i < merges_.size(); ++i) {
    const auto [l, r] = merges_[i];
    const uint32_t id = 256 + static_cast<uint32_t>(i);
    if (l >= id || r >= id)
      throw std::invalid_argument("bpe: merge " + std::to_string(i) + " (" + std::to_string(l) +
                                  ", " + std::to_string(r) + ") refers to a later token");
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
  while (256 + merges.size() < vocab_size && !heap.empty()) {
    const auto [count, key] = heap.top();
    heap.pop();
    auto it = pair_counts.find(key);
    if (it == pair_counts.end() || it->second != count) continue;  // stale entry
    if (count < 2) break;                                           // nothing worth merging
    const uint32_t left = static_cast<uint32_t>(key >> 32), right = static_cast<uint32_t>(key);
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

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("tokenizer " + path + ": cannot open");
  const bool json_name = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (json_name || (in >> std::ws).peek() == '{') return HfTokenizer::from_file(path);
  int line_no = 0;
  auto expect = [&](const std::string& key) {
    std::string line, k;
    ++line_no;
    if (!std::getline(in, line))
      throw std::runtime_error("tokenizer " + path + ": line " + std::to_string(line_no) +
                               ": expected '" + key + " ...', got end of file");
    std::istringstream ls(line);
    std::string value;
    ls >> k >> value;
    if (k != key)
      throw std::runtime_error("tokenizer " + path + ": line " + std::to_string(line_no) +
                               ": expected '" + key + " ...', got '" + line + "'");
    return value;
  };
  if (expect("modtrain-tokenizer") != "1")
    throw std::runtime_error("tokenizer " + path + ": unsupported version");
  const std::string kind = expect("kind");
  const uint64_t vocab = std::stoull(expect("vocab_size"));
  const uint64_t n = std::stoull(expect("merges"));
  if (kind == "byte") {
    if (vocab != 256 || n != 0)
      throw std::runtime_error("tokenizer " + path + ": a byte tokenizer has vocab 256, 0 merges");
    return std::make_unique<ByteTokenizer>();
  }
  if (kind != "bpe")
    throw std::runtime_error("tokenizer " + path + ": kind '" + kind + "', expected byte or bpe");
  if (vocab != 256 + n)
    throw std::runtime_error("tokenizer " + path + ": vocab_size " + std::to_string(vocab) +
                             " != 256 + merges " + std::to_string(n));
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  merges.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t l, r;
    ++line_no;
    if (!(in >> l >> r))
      throw std::runtime_error("tokenizer " + path + ": line " + std::to_string(line_no) +
                               ": expected a merge 'left right'");
    merges.emplace_back(l, r);
  }
  return std::make_unique<BpeTokenizer>(std::move(merges));
}

}  // namespace mod::data
