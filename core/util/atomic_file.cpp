// Atomic file replacement (see atomic_file.h).
#include "core/util/atomic_file.h"

#include <unistd.h>

namespace mod::util {

namespace {
std::string temp_path(const std::string& path) {
  return path + ".tmp";
}

void publish(const std::string& temp, const std::string& path) {
  rename_path(temp, path);
  fsync_dir(parent_dir(path));
}
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), out_(temp_path(path_)) {}

AtomicFile::~AtomicFile() {
  if (!committed_) ::unlink(temp_path(path_).c_str());
}

void AtomicFile::commit() {
  out_.close();
  publish(temp_path(path_), path_);
  committed_ = true;
}

void replace_file(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

void replace_file_with(const std::string& path,
                       const std::function<void(const std::string& temp_path)>& write_to) {
  const std::string temp = temp_path(path);
  try {
    write_to(temp);
    fsync_file(temp);
    publish(temp, path);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
}

}  // namespace mod::util
