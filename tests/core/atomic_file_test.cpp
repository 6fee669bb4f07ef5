// The one atomic file writer (core/util/atomic_file.h): a replacement appears whole or not at
// all, and a failing write, fsync or rename (injected through set_file_syscalls_for_tests) is
// reported naming the file and the call, leaving the old file and no temp file behind.
#include "core/util/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace mod;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("modtrain_atomic_" + std::to_string(::getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_dir(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
}

// Installs failing system calls for one scope.
struct Inject {
  explicit Inject(const util::FileSyscalls& calls) { util::set_file_syscalls_for_tests(calls); }
  ~Inject() { util::set_file_syscalls_for_tests(util::FileSyscalls{}); }
};

util::FileSyscalls failing_write() {
  util::FileSyscalls c;
  c.write = [](int, const void*, size_t) -> ssize_t { return errno = ENOSPC, -1; };
  return c;
}
util::FileSyscalls failing_file_fsync() {
  util::FileSyscalls c;
  c.fsync = [](int fd) { return is_dir(fd) ? ::fsync(fd) : (errno = EIO, -1); };
  return c;
}
util::FileSyscalls failing_dir_fsync() {
  util::FileSyscalls c;
  c.fsync = [](int fd) { return is_dir(fd) ? (errno = EIO, -1) : ::fsync(fd); };
  return c;
}
util::FileSyscalls failing_rename() {
  util::FileSyscalls c;
  c.rename = [](const char*, const char*) { return errno = EXDEV, -1; };
  return c;
}
}  // namespace

TEST_CASE("replace_file replaces the file whole and leaves no temp file", "[io]") {
  const fs::path dir = temp_dir("replace");
  const std::string path = (dir / "state.txt").string();
  util::replace_file(path, "first\n");
  util::replace_file(path, "second, longer\n");
  CHECK(read_text(path) == "second, longer\n");
  util::replace_file_with(path, [](const std::string& temp) { std::ofstream(temp) << "third\n"; });
  CHECK(read_text(path) == "third\n");
  {
    util::AtomicFile f(path);
    f.write("never committed");
  }
  CHECK(read_text(path) == "third\n");
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK_THROWS_WITH(util::replace_file((dir / "no/such/dir/f").string(), "x"),
                    Contains("cannot create " + (dir / "no/such/dir/f.tmp").string()));
}

TEST_CASE("an injected write, fsync or rename failure names the file and the call", "[io]") {
  const fs::path dir = temp_dir("inject");
  const std::string path = (dir / "dataset.textproto").string();
  util::replace_file(path, "old\n");
  struct Case {
    const char* name;
    util::FileSyscalls calls;
    std::string message;
  };
  const Case cases[] = {
      {"write", failing_write(), "cannot write " + path + ".tmp: No space left on device"},
      {"fsync", failing_file_fsync(), "cannot fsync " + path + ".tmp: Input/output error"},
      {"rename", failing_rename(),
       "cannot rename " + path + ".tmp to " + path + ": Invalid cross-device link"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    {
      Inject inject(c.calls);
      CHECK_THROWS_MATCHES(util::replace_file(path, "new\n"), util::FileError,
                           Catch::Matchers::Message(c.message));
      if (c.name != std::string("write"))  // a path writer's own writes are its own
        CHECK_THROWS_WITH(
            util::replace_file_with(path, [](const std::string& t) { std::ofstream(t) << "new"; }),
            c.message);
    }
    CHECK(read_text(path) == "old\n");  // the old file, whole
    CHECK_FALSE(fs::exists(path + ".tmp"));
  }
  // The directory's fsync comes after the rename: the new file is in place, the error says so.
  {
    Inject inject(failing_dir_fsync());
    CHECK_THROWS_WITH(util::replace_file(path, "new\n"),
                      "cannot fsync directory " + dir.string() + ": Input/output error");
  }
  CHECK(read_text(path) == "new\n");
}
