// Durable file operations for checkpoints, on POSIX descriptors: every write, fsync, rename and
// unlink error becomes a std::runtime_error "checkpoint: cannot <action> <path>: <strerror>", so a
// full disk or a read-only directory is reported with the path that failed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mod::ckpt::io {

// Throws "checkpoint: <what>: <strerror(err)>"; `what` names the action and the path.
[[noreturn]] void fail(const std::string& what, int err);

// A file opened for writing (created, truncated); close() fsyncs first. Closes without fsync
// when destroyed unclosed (an error path).
class OutFile {
 public:
  explicit OutFile(const std::string& path);
  ~OutFile();
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  void write(const void* data, size_t n);
  void pad_to(uint64_t offset);  // writes zeros up to `offset` bytes from the start
  uint64_t size() const { return written_; }
  void close();  // fsync + close

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

void fsync_dir(const std::string& dir);
void make_dir(const std::string& dir);  // one level; an existing directory is fine
void rename_path(const std::string& from, const std::string& to);
// Swaps two existing directories atomically (renameat2 RENAME_EXCHANGE); false when the file
// system does not support it.
bool exchange_paths(const std::string& a, const std::string& b);
// Writes bytes to path (created, truncated) and fsyncs it.
void write_file(const std::string& path, const std::string& bytes);
// Replaces path atomically: path.tmp written and fsync'd, renamed over path, directory fsync'd.
void replace_file(const std::string& path, const std::string& bytes);
// The whole file; an error naming the path when it cannot be opened or read.
std::string read_file(const std::string& path);
// Reads exactly n bytes at offset; returns false at end of file (a truncated file).
bool read_at(int fd, void* data, size_t n, uint64_t offset, const std::string& path);

}  // namespace mod::ckpt::io
