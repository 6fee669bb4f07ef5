// Durable POSIX file operations with errors that name the path (see file_io.h).
#include "core/util/file_io.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace mod::util {

namespace {
FileSyscalls g_calls;
}  // namespace

FileSyscalls::FileSyscalls() : write(::write), fsync(::fsync), rename(::rename) {}

void set_file_syscalls_for_tests(const FileSyscalls& calls) {
  g_calls = calls;
}

void file_fail(const std::string& what, int err) {
  throw FileError(what + ": " + std::strerror(err));
}

OutFile::OutFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) file_fail("cannot create " + path, errno);
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutFile::write(const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = g_calls.write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      file_fail("cannot write " + path_, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void OutFile::pad_to(uint64_t offset) {
  static const char kZeros[64] = {};
  while (written_ < offset) write(kZeros, std::min<uint64_t>(sizeof kZeros, offset - written_));
}

void OutFile::close() {
  if (g_calls.fsync(fd_) != 0) file_fail("cannot fsync " + path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) file_fail("cannot close " + path_, errno);
}

namespace {
void fsync_opened(const std::string& path, bool dir) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
  const std::string kind = dir ? "directory " : "";
  if (fd < 0) file_fail("cannot open " + kind + path, errno);
  const int rc = g_calls.fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) file_fail("cannot fsync " + kind + path, err);
}
}  // namespace

void fsync_file(const std::string& path) {
  fsync_opened(path, false);
}
void fsync_dir(const std::string& dir) {
  fsync_opened(dir, true);
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    file_fail("cannot create directory " + dir, errno);
}

void rename_path(const std::string& from, const std::string& to) {
  if (g_calls.rename(from.c_str(), to.c_str()) != 0)
    file_fail("cannot rename " + from + " to " + to, errno);
}

bool exchange_paths(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
  file_fail("cannot exchange " + a + " with " + b, errno);
}

void write_file(const std::string& path, const std::string& bytes) {
  OutFile f(path);
  f.write(bytes.data(), bytes.size());
  f.close();
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) file_fail("cannot open " + path, errno);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      file_fail("cannot read " + path, err);
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

bool read_at(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      file_fail("cannot read " + path, errno);
    }
    if (r == 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

}  // namespace mod::util
