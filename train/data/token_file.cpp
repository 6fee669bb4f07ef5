// Token files: memory-mapped readers of three formats and the appending shard writer (see
// token_file.h).
#include "train/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "core/util/crc32c.h"

namespace mod::data {

namespace {
constexpr char kMagic[8] = {'M', 'O', 'D', 'T', 'O', 'K', 'S', '1'};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("token file " + path + ": " + what);
}
[[noreturn]] void fail_errno(const std::string& path, const std::string& what) {
  fail(path, what + ": " + std::strerror(errno));
}

template <typename T>
T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string header_bytes(uint32_t width, uint32_t vocab, uint64_t count) {
  std::string h(kShardHeaderBytes, '\0');
  std::memcpy(h.data(), kMagic, 8);
  std::memcpy(h.data() + 8, &kShardVersion, 4);
  std::memcpy(h.data() + 12, &width, 4);
  std::memcpy(h.data() + 16, &vocab, 4);
  std::memcpy(h.data() + 24, &count, 8);
  return h;
}

void write_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "write failed");
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
}
}  // namespace

const char* format_name(TokenFormat f) {
  switch (f) {
    case modtrain::data::LLMC: return "llm.c";
    case modtrain::data::NANOGPT: return "nanoGPT";
    default: return "modtrain";
  }
}

struct TokenFile::Map {
  const unsigned char* base = nullptr;
  size_t bytes = 0;
  ~Map() {
    if (base) ::munmap(const_cast<unsigned char*>(base), bytes);
  }
};

TokenFile TokenFile::open(const std::string& path, TokenFormat format, uint32_t vocab_size) {
  TokenFile f;
  f.path_ = path;
  f.format_ = format;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno(path, "cannot open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_errno(path, "cannot stat");
  }
  f.file_bytes_ = static_cast<uint64_t>(st.st_size);
  auto map = std::make_shared<Map>();
  if (f.file_bytes_ > 0) {
    void* p = ::mmap(nullptr, f.file_bytes_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail_errno(path, "cannot map");
    }
    map->base = static_cast<const unsigned char*>(p);
    map->bytes = f.file_bytes_;
    ::madvise(p, f.file_bytes_, MADV_RANDOM);  // windows are read at random: no read-ahead
  }
  ::close(fd);
  const unsigned char* h = map->base;
  const uint64_t bytes = f.file_bytes_;
  switch (format) {
    case modtrain::data::MODTRAIN: {
      if (bytes < kShardHeaderBytes)
        fail(path, std::to_string(bytes) + " bytes, shorter than the 32-byte header");
      if (std::memcmp(h, kMagic, 8) != 0) fail(path, "magic: not a modtrain token shard");
      const uint32_t version = get<uint32_t>(h + 8);
      if (version != kShardVersion)
        fail(path, "version " + std::to_string(version) + ", this build reads version " +
                       std::to_string(kShardVersion));
      f.width_ = get<uint32_t>(h + 12);
      f.vocab_ = get<uint32_t>(h + 16);
      if (get<uint32_t>(h + 20) != 0) fail(path, "reserved header field is not 0");
      f.tokens_ = get<uint64_t>(h + 24);
      f.data_offset_ = kShardHeaderBytes;
      if (f.width_ != 2 && f.width_ != 4)
        fail(path, "token width " + std::to_string(f.width_) + " bytes, expected 2 or 4");
      if (f.vocab_ == 0 || (f.width_ == 2 && f.vocab_ > 65536))
        fail(path, "vocab size " + std::to_string(f.vocab_) + " does not fit " +
                       std::to_string(f.width_) + "-byte tokens");
      // The writer picks the narrowest width; a 4-byte shard of a small vocabulary is corrupt.
      if (f.width_ == 4 && f.vocab_ <= 65536)
        fail(path, "token width 4 bytes for vocab size " + std::to_string(f.vocab_) +
                       " (the writer uses 2 bytes up to 65536): corrupt header");
      if (vocab_size != 0 && f.vocab_ != vocab_size)
        fail(path, "vocab size " + std::to_string(f.vocab_) + ", the dataset's is " +
                       std::to_string(vocab_size));
      break;
    }
    case modtrain::data::LLMC: {
      if (bytes < kLlmcHeaderBytes)
        fail(path, std::to_string(bytes) + " bytes, shorter than llm.c's 1024-byte header");
      const int32_t magic = get<int32_t>(h), version = get<int32_t>(h + 4),
                    count = get<int32_t>(h + 8);
      if (magic != kLlmcMagic)
        fail(path, "llm.c header: magic " + std::to_string(magic) + ", expected " +
                       std::to_string(kLlmcMagic));
      if (version != 1)
        fail(path, "llm.c header: version " + std::to_string(version) +
                       ", expected 1 (uint16 tokens)");
      if (count < 0) fail(path, "llm.c header: token count " + std::to_string(count) + " < 0");
      for (uint64_t i = 3; i < kLlmcHeaderBytes / 4; ++i)  // llm.c writes zeros there
        if (get<int32_t>(h + 4 * i) != 0)
          fail(path, "llm.c header: int " + std::to_string(i) + " is " +
                         std::to_string(get<int32_t>(h + 4 * i)) + ", expected 0 (corrupt header)");
      f.width_ = 2;
      f.tokens_ = static_cast<uint64_t>(count);
      f.data_offset_ = kLlmcHeaderBytes;
      if (vocab_size == 0 || vocab_size > 65536)
        fail(path, "llm.c shards hold uint16 tokens: the vocabulary must be in [1, 65536], not " +
                       std::to_string(vocab_size));
      f.vocab_ = vocab_size;
      break;
    }
    case modtrain::data::NANOGPT: {
      if (vocab_size == 0 || vocab_size > 65536)
        fail(path, "nanoGPT .bin files hold uint16 tokens: give a vocabulary in [1, 65536], not " +
                       std::to_string(vocab_size));
      if (bytes % 2 != 0)
        fail(path, std::to_string(bytes) + " bytes, not a whole number of uint16 tokens");
      f.width_ = 2;
      f.vocab_ = vocab_size;
      f.tokens_ = bytes / 2;
      break;
    }
    default: fail(path, "unknown token format " + std::to_string(static_cast<int>(format)));
  }
  // The count is checked against the size before any token is read (no overflow: count <= 2^63).
  if (f.tokens_ > (bytes - f.data_offset_) / f.width_ ||
      f.data_offset_ + f.tokens_ * f.width_ != bytes)
    fail(path, "file is " + std::to_string(bytes) + " bytes but the header promises " +
                   std::to_string(f.tokens_) + " tokens of " + std::to_string(f.width_) +
                   " bytes after a " + std::to_string(f.data_offset_) +
                   "-byte header: truncated or corrupt");
  f.map_ = std::move(map);
  f.unmap(0, f.data_offset_);  // the header's pages, read above
  return f;
}

namespace {
// The span a fault may have mapped around a read: a kernel with large page-cache folios (ext4
// and xfs on Linux 6.x) maps a whole folio, up to a 2 MiB huge page, on one fault, so a
// 1 KiB window can add 2 MiB to the resident set.
constexpr uint64_t kFolioBytes = 2ull << 20;
}  // namespace

void TokenFile::unmap(uint64_t offset, uint64_t bytes) const {
  if (!map_->base || bytes == 0) return;
  const uint64_t from = offset / kFolioBytes * kFolioBytes;
  const uint64_t to = std::min(map_->bytes, (offset + bytes + kFolioBytes - 1) / kFolioBytes *
                                                kFolioBytes);
  ::madvise(const_cast<unsigned char*>(map_->base) + from, to - from, MADV_DONTNEED);
}

void TokenFile::read(uint64_t begin, uint64_t n, int64_t* out) const {
  if (begin > tokens_ || n > tokens_ - begin)
    fail(path_, "read of tokens [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                    ") past its " + std::to_string(tokens_) + " tokens");
  const unsigned char* p = map_->base + data_offset_ + begin * width_;
  uint32_t worst = 0;
  if (width_ == 2) {
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t t = get<uint16_t>(p + 2 * i);
      worst = std::max(worst, t);
      out[i] = t;
    }
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t t = get<uint32_t>(p + 4 * i);
      worst = std::max(worst, t);
      out[i] = t;
    }
  }
  unmap(data_offset_ + begin * width_, n * width_);
  if (worst >= vocab_)
    for (uint64_t i = 0; i < n; ++i)
      if (out[i] >= vocab_)
        fail(path_, "token " + std::to_string(begin + i) + " = " + std::to_string(out[i]) +
                        " is outside the vocabulary of " + std::to_string(vocab_));
}

uint32_t TokenFile::sample_crc() const {
  constexpr uint64_t kBlock = 4096, kBlocks = 16;
  if (file_bytes_ <= kBlock * kBlocks) return full_crc();
  uint32_t crc = crc32c(map_->base, data_offset_);
  const uint64_t stride = (file_bytes_ - kBlock) / (kBlocks - 1);
  for (uint64_t b = 0; b < kBlocks; ++b) {
    crc = crc32c(map_->base + b * stride, kBlock, crc);
    unmap(b * stride, kBlock);
  }
  return crc;
}

// In pieces, each unmapped once summed: a shard of any size leaves at most one mapped.
uint32_t TokenFile::full_crc() const {
  constexpr uint64_t kPiece = 16 * kFolioBytes;
  uint32_t crc = 0;
  for (uint64_t at = 0; at < file_bytes_; at += kPiece) {
    const uint64_t n = std::min(kPiece, file_bytes_ - at);
    crc = crc32c(map_->base + at, n, crc);
    unmap(at, n);
  }
  return crc;
}

std::vector<uint32_t> read_all(const TokenFile& f) {
  std::vector<int64_t> wide(f.tokens());
  f.read(0, f.tokens(), wide.data());
  return std::vector<uint32_t>(wide.begin(), wide.end());
}

// --- writer ---

ShardWriter::ShardWriter(std::string path, uint32_t vocab_size, uint64_t keep_tokens)
    : path_(std::move(path)), vocab_(vocab_size), width_(vocab_size <= 65536 ? 2 : 4) {
  if (vocab_size == 0) fail(path_, "vocabulary size 0");
  const std::string partial = path_ + ".partial";
  fd_ = ::open(partial.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | (keep_tokens ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) fail_errno(partial, "cannot open for writing");
  if (keep_tokens > 0) {
    struct stat st {};
    const uint64_t need = kShardHeaderBytes + keep_tokens * width_;
    if (::fstat(fd_, &st) != 0 || static_cast<uint64_t>(st.st_size) < need)
      fail(partial, "cannot resume: it holds fewer than the " + std::to_string(keep_tokens) +
                        " tokens recorded");
    if (::ftruncate(fd_, static_cast<off_t>(need)) != 0) fail_errno(partial, "cannot truncate");
    tokens_ = keep_tokens;
  }
  const std::string h = header_bytes(width_, vocab_, 0);
  write_all(fd_, h.data(), h.size(), 0, partial);
}

ShardWriter::~ShardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void ShardWriter::append(const uint32_t* tokens, size_t n) {
  std::vector<unsigned char> buf(n * width_);
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] >= vocab_)
      fail(path_, "token " + std::to_string(tokens_ + i) + " = " + std::to_string(tokens[i]) +
                      " is outside the vocabulary of " + std::to_string(vocab_));
    if (width_ == 2) {
      const uint16_t t = static_cast<uint16_t>(tokens[i]);
      std::memcpy(buf.data() + 2 * i, &t, 2);
    } else {
      std::memcpy(buf.data() + 4 * i, &tokens[i], 4);
    }
  }
  write_all(fd_, buf.data(), buf.size(), kShardHeaderBytes + tokens_ * width_, path_ + ".partial");
  tokens_ += n;
}

void ShardWriter::sync() {
  if (::fsync(fd_) != 0) fail_errno(path_ + ".partial", "fsync failed");
}

uint32_t ShardWriter::finish() {
  const std::string partial = path_ + ".partial";
  const std::string h = header_bytes(width_, vocab_, tokens_);
  write_all(fd_, h.data(), h.size(), 0, partial);
  sync();
  ::close(fd_);
  fd_ = -1;
  if (std::rename(partial.c_str(), path_.c_str()) != 0) fail_errno(path_, "cannot rename " + partial);
  return TokenFile::open(path_, modtrain::data::MODTRAIN, vocab_).full_crc();
}

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, uint32_t vocab_size) {
  ShardWriter w(path, vocab_size);
  w.append(tokens.data(), tokens.size());
  w.finish();
}

}  // namespace mod::data
