// Durable POSIX file operations shared by every layer (checkpoints, datasets, prep, metrics,
// grids, exports). Invariant: every failing write, fsync, rename, open or read throws a
// FileError "cannot <action> <path>: <strerror>", so a full disk or a read-only directory is
// reported with the path and the call that failed; nothing here fails silently.
// Replacing a file atomically is core/util/atomic_file.h, built on these.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace mod::util {

// A failed file operation; the message names the action, the path and strerror.
class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws FileError "<what>: <strerror(err)>"; `what` names the action and the path.
[[noreturn]] void file_fail(const std::string& what, int err);

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
  const std::string& path() const { return path_; }
  void close();  // fsync + close

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

void fsync_file(const std::string& path);  // a file written by someone else
void fsync_dir(const std::string& dir);
// The directory holding path ("." for a bare file name).
std::string parent_dir(const std::string& path);
void make_dir(const std::string& dir);  // one level; an existing directory is fine
void rename_path(const std::string& from, const std::string& to);
// Swaps two existing directories atomically (renameat2 RENAME_EXCHANGE); false when the file
// system does not support it.
bool exchange_paths(const std::string& a, const std::string& b);
// Writes bytes to path (created, truncated) and fsyncs it; not atomic (see atomic_file.h).
void write_file(const std::string& path, const std::string& bytes);
// The whole file; a FileError naming the path when it cannot be opened or read.
std::string read_file(const std::string& path);
// Reads exactly n bytes at offset; returns false at end of file (a truncated file).
bool read_at(int fd, void* data, size_t n, uint64_t offset, const std::string& path);

// Tests only: the system calls the writers here go through, so a test can inject a failing
// write, fsync or rename; set_file_syscalls_for_tests(FileSyscalls{}) restores the real ones.
struct FileSyscalls {
  ssize_t (*write)(int fd, const void* data, size_t n);
  int (*fsync)(int fd);
  int (*rename)(const char* from, const char* to);
  FileSyscalls();  // the real calls
};
void set_file_syscalls_for_tests(const FileSyscalls& calls);

}  // namespace mod::util
