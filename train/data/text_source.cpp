// Streamed documents from text, JSON Lines and gzip inputs (see text_source.h).
#include "train/data/text_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/util/crc32c.h"
#include "core/util/file_io.h"

namespace mod::data {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}
constexpr size_t kReadBytes = 1 << 20;
}  // namespace

InputInfo inspect_input(const std::string& name) {
  InputInfo in;
  in.name = name;
  if (name == "-") {
    in.kind = InputKind::Stdin;
    return in;
  }
  if (name == "kjv") {
    in.kind = InputKind::Kjv;
    return in;
  }
  in.gzip = ends_with(name, ".gz");
  in.kind = ends_with(name, ".jsonl") || ends_with(name, ".jsonl.gz") || ends_with(name, ".json.gz")
                ? InputKind::Jsonl
                : InputKind::PlainText;
  struct stat st {};
  if (::stat(name.c_str(), &st) != 0) fail(name, std::string("cannot open: ") + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(name, "cannot open: is a directory");
  if (::access(name.c_str(), R_OK) != 0)
    fail(name, std::string("cannot open: ") + std::strerror(errno));
  in.size = st.st_size;
  return in;
}

uint32_t input_tail_crc(const InputInfo& in, uint64_t offset) {
  if (!in.seekable()) return 0;
  if (offset > static_cast<uint64_t>(in.size))
    fail(in.name,
         "offset " + std::to_string(offset) + " is past its " + std::to_string(in.size) + " bytes");
  char tail[64];
  const size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof tail, offset));
  const int fd = ::open(in.name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(in.name, std::string("cannot open: ") + std::strerror(errno));
  bool whole = false;
  try {
    whole = util::read_at(fd, tail, n, offset - n, in.name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  if (!whole)
    fail(in.name, "shorter than " + std::to_string(offset) + " bytes (changed while read?)");
  return crc32c(tail, n);
}

// A buffered byte stream over a file, gzip file, stdin or the `bible` pipe.
struct TextSource::Reader {
  InputInfo info;
  int fd = -1;
  gzFile gz = nullptr;
  FILE* pipe = nullptr;
  std::string buf;
  size_t begin = 0;        // buf[begin, end) is unread
  uint64_t offset = 0;     // stream offset of buf[begin]
  uint64_t pipe_bytes = 0;
  bool eof = false;

  explicit Reader(InputInfo in, uint64_t start) : info(std::move(in)), offset(start) {
    if (info.kind == InputKind::Stdin) {
      fd = 0;
    } else if (info.kind == InputKind::Kjv) {
      pipe = ::popen("bible Gen1:1-Rev22:21 2>/dev/null", "r");
      if (!pipe) fail("--kjv", "cannot run `bible` (install Debian's bible-kjv)");
    } else if (info.gzip) {
      gz = ::gzopen(info.name.c_str(), "rb");
      if (!gz) fail(info.name, std::string("cannot open: ") + std::strerror(errno));
      ::gzbuffer(gz, 1 << 17);
      // zlib reads a file without the gzip magic as plain bytes; a .gz input must be gzip.
      if (::gzdirect(gz)) {
        ::gzclose(gz);  // a throwing constructor runs no destructor
        gz = nullptr;
        fail(info.name, "not gzip data (no gzip header; a .gz input must be gzip-compressed)");
      }
    } else {
      fd = ::open(info.name.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) fail(info.name, std::string("cannot open: ") + std::strerror(errno));
      if (start > 0 && ::lseek(fd, static_cast<off_t>(start), SEEK_SET) < 0)
        fail(info.name, std::string("cannot seek: ") + std::strerror(errno));
    }
  }
  ~Reader() {
    if (gz) ::gzclose(gz);
    if (fd > 0) ::close(fd);
    if (pipe) ::pclose(pipe);
  }

  size_t raw_read(char* p, size_t n) {
    if (gz) {
      const int got = ::gzread(gz, p, static_cast<unsigned>(n));
      int err = Z_OK;
      const char* msg = ::gzerror(gz, &err);
      if (got < 0 || (err != Z_OK && err != Z_STREAM_END))
        fail(info.name, std::string("corrupt gzip: ") + (msg ? msg : "read failed"));
      return static_cast<size_t>(got);
    }
    if (pipe) {
      const size_t got = std::fread(p, 1, n, pipe);
      pipe_bytes += got;
      if (got == 0) {
        const int status = ::pclose(pipe);
        pipe = nullptr;
        if (status != 0 || pipe_bytes < 1000000)
          fail("--kjv", "`bible Gen1:1-Rev22:21` failed or printed only " +
                            std::to_string(pipe_bytes) + " bytes (install Debian's bible-kjv)");
      }
      return got;
    }
    for (;;) {
      const ssize_t got = ::read(fd, p, n);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) fail(info.name, std::string("read failed: ") + std::strerror(errno));
    }
  }

  size_t avail() const { return buf.size() - begin; }
  // Reads until at least need bytes are unread or the stream ends.
  void fill(size_t need) {
    if (begin > 0 && begin >= buf.size() / 2) {
      buf.erase(0, begin);
      begin = 0;
    }
    while (!eof && avail() < need) {
      const size_t old = buf.size(), want = std::max(kReadBytes, need - avail());
      buf.resize(old + want);
      const size_t got = raw_read(buf.data() + old, want);
      buf.resize(old + got);
      if (got == 0) eof = true;
    }
  }
  void consume(size_t n) {
    begin += n;
    offset += n;
  }
  bool at_end() {
    fill(1);
    return avail() == 0;
  }
  // Bytes of the input read so far, as the input's size counts them (compressed for gzip).
  uint64_t progress() const {
    if (gz) return static_cast<uint64_t>(std::max<z_off_t>(0, ::gzoffset(gz)));
    return offset;
  }
};

TextSource::TextSource(std::vector<InputInfo> inputs, std::string text_field, size_t chunk_bytes)
    : inputs_(std::move(inputs)), text_field_(std::move(text_field)), chunk_bytes_(chunk_bytes) {}
TextSource::~TextSource() = default;

void TextSource::open_input(uint32_t i) {
  const InputInfo& in = inputs_[i];
  reader_ = std::make_unique<Reader>(in, in.seekable() ? pos_.offset : 0);
}

void TextSource::seek(const Position& p) {
  reader_.reset();
  have_ahead_ = started_ = false;
  finished_bytes_ = 0;
  for (uint32_t i = 0; i < p.input && i < inputs_.size(); ++i)
    finished_bytes_ += static_cast<uint64_t>(std::max<int64_t>(0, inputs_[i].size));
  if (p.input >= inputs_.size()) {
    pos_ = {p.input, 0, 0, 0};
    return;
  }
  if (inputs_[p.input].seekable()) {
    pos_ = p;
    open_input(p.input);
    return;
  }
  pos_ = {p.input, 0, 0, 0};  // replay: read and drop the documents before p
  Document skip;
  for (uint64_t k = 0; k < p.document; ++k)
    if (!read_one(skip) || skip.input != p.input)
      fail(inputs_[p.input].name, "cannot resume: it holds fewer than the " +
                                      std::to_string(p.document) + " documents read before");
}

bool TextSource::next(Document& d) {
  if (!started_) {
    started_ = true;
    have_ahead_ = read_one(ahead_);
  }
  if (!have_ahead_) return false;
  d = std::move(ahead_);
  ahead_ = Document{};
  have_ahead_ = read_one(ahead_);
  d.last = !have_ahead_;
  return true;
}

bool TextSource::read_one(Document& d) {
  while (pos_.input < inputs_.size()) {
    if (!reader_) open_input(pos_.input);
    Reader& r = *reader_;
    const InputInfo& in = inputs_[pos_.input];
    bool got = false;
    if (in.kind == InputKind::Jsonl) {
      for (;;) {
        size_t scanned = 0;
        const char* nl = nullptr;
        for (;;) {  // find the line's end, reading more as needed
          r.fill(scanned + 1);
          const size_t a = r.avail();
          if (a > scanned)
            nl = static_cast<const char*>(std::memchr(r.buf.data() + r.begin + scanned, '\n', a - scanned));
          if (nl || r.eof) break;
          scanned = a;
          r.fill(a + kReadBytes);
        }
        const size_t len = nl ? static_cast<size_t>(nl - (r.buf.data() + r.begin)) : r.avail();
        if (!nl && len == 0) break;  // end of the input
        std::string_view line(r.buf.data() + r.begin, len);
        const uint64_t line_no = ++pos_.line;
        const bool blank = line.find_first_not_of(" \t\r") == std::string_view::npos;
        if (!blank) {
          nlohmann::json j;
          const std::string where = in.name + ":" + std::to_string(line_no);
          try {
            j = nlohmann::json::parse(line);
          } catch (const nlohmann::json::exception& e) {
            fail(where, std::string("not JSON: ") + e.what());
          }
          const auto it = j.is_object() ? j.find(text_field_) : j.end();
          if (!j.is_object() || it == j.end() || !it->is_string())
            fail(where, "no string field \"" + text_field_ + "\"");
          d.text = it->get<std::string>();
        }
        r.consume(nl ? len + 1 : len);
        if (!blank) {
          d.eot_after = true;
          got = true;
          break;
        }
      }
    } else {
      size_t t = chunk_bytes_;
      if (in.size > 0 && !in.gzip) {  // nearly equal documents for a file of known size
        const uint64_t n = (static_cast<uint64_t>(in.size) + chunk_bytes_ - 1) / chunk_bytes_;
        t = static_cast<size_t>((static_cast<uint64_t>(in.size) + n - 1) / n);
      }
      r.fill(2 * t);
      const size_t a = r.avail();
      if (a > 0) {
        size_t len = a;
        if (a > t) {
          const char* base = r.buf.data() + r.begin;
          const size_t stop = std::min(a, 2 * t);
          const void* nl = std::memchr(base + t - 1, '\n', stop - (t - 1));
          len = nl ? static_cast<size_t>(static_cast<const char*>(nl) - base) + 1 : stop;
        }
        d.text.assign(r.buf.data() + r.begin, len);
        r.consume(len);
        d.eot_after = r.at_end();
        got = true;
      }
    }
    if (got) {
      ++pos_.document;
      pos_.offset = r.offset;
      d.input = pos_.input;
      d.next = pos_;
      d.input_bytes = finished_bytes_ + r.progress();
      return true;
    }
    finished_bytes_ += in.size >= 0 ? static_cast<uint64_t>(in.size) : r.offset;
    reader_.reset();
    pos_ = {pos_.input + 1, 0, 0, 0};
  }
  return false;
}

}  // namespace mod::data
