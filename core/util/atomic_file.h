// The one way a file is replaced in modtrain: written to path.tmp beside it, fsync'd, renamed
// over path, and the directory fsync'd. Invariant: after a crash at any point path holds the old
// bytes or the new ones, never a mix; every failure is a FileError naming the file and the call
// (file_io.h), and the temp file is removed.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "core/util/file_io.h"

namespace mod::util {

// A replacement of `path` written piece by piece; nothing changes at path until commit().
// Destroyed uncommitted (an error path), it removes its temp file.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n) { out_.write(data, n); }
  void write(std::string_view bytes) { out_.write(bytes.data(), bytes.size()); }
  void commit();  // fsync, rename over path, fsync the directory

 private:
  std::string path_;
  OutFile out_;
  bool committed_ = false;
};

// Replaces path atomically with bytes.
void replace_file(const std::string& path, std::string_view bytes);
// Replaces path atomically with what `write_to` writes at the temp path it is given, for
// writers that only take a path.
void replace_file_with(const std::string& path,
                       const std::function<void(const std::string& temp_path)>& write_to);

}  // namespace mod::util
