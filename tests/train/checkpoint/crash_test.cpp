// Crash safety: a forked child saves with a fault point set (SaveOptions::fault, modtrain's
// MOD_CHECKPOINT_FAULT) and is killed there (after_shard, after_metadata, after_rename;
// foreground and background); the parent finds
// `latest` still naming the previous checkpoint, which reads back, and the next save cleans up.
// A child whose file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes writes fail with EFBIG gets
// a clear error, and the previous checkpoint stays intact.
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "tests/train/checkpoint/helpers.h"
#include "train/checkpoint/reader.h"
#include "train/checkpoint/writer.h"

using namespace mod;
using namespace mod::test;

namespace {

std::vector<ckpt::TensorEntry> entries_at(double start) {
  const Tensor w = counting({32, 64}, DType::F32, start);
  return {piece("model/w", w, 0, 0, 2), piece("model/w", w, 0, 1, 2),
          whole("optim/m/w", counting({32, 64}, DType::F32, -start))};
}

void check_reads_back(const std::string& dir, double start) {
  ckpt::CheckpointReader r(dir);
  CHECK(bitwise_equal(r.read_full("model/w"), counting({32, 64}, DType::F32, start)));
  CHECK(bitwise_equal(r.read_full("optim/m/w"), counting({32, 64}, DType::F32, -start)));
}

// Runs fn in a forked child; returns the wait status. The child never returns into Catch.
template <typename Fn>
int in_child(Fn fn) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // not left behind by a parent the watchdog ends
    int code = 0;
    try {
      code = fn();
    } catch (...) {
      code = 99;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("a save killed at any fault point leaves the previous checkpoint current",
          "[checkpoint]") {
  const std::string point = GENERATE("after_shard", "after_metadata", "after_rename");
  const bool background = GENERATE(false, true);
  INFO("fault point " << point << (background ? ", background" : ""));
  ScratchDir run("crash");
  const fs::path ck = run.path / "checkpoints";
  {
    auto comm = parallel::make_local_communicator();
    ckpt::Checkpointer(run.str(), *comm).save(entries_at(1), state_at(10));
  }
  const int status = in_child([&] {
    auto comm = parallel::make_local_communicator();
    ckpt::Checkpointer writer(run.str(), *comm);
    writer.save(entries_at(2), state_at(20),
                {.background = background, .fault = ckpt::parse_fault_point(point)});
    writer.wait();
    return 3;  // not reached: the fault point kills the process
  });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);

  CHECK(file_text(ck / "latest") == "step_00000010\n");
  REQUIRE(ckpt::find_latest(run.str()) == (ck / "step_00000010").string());
  check_reads_back((ck / "step_00000010").string(), 1);
  if (point == "after_shard") {
    CHECK(fs::exists(ck / "step_00000020.tmp/shard_0.bin"));
    CHECK_FALSE(fs::exists(ck / "step_00000020.tmp/metadata.pb"));
  } else if (point == "after_metadata") {
    CHECK(fs::exists(ck / "step_00000020.tmp/metadata.pb"));
    CHECK_FALSE(fs::exists(ck / "step_00000020"));
  } else {  // renamed and complete, but not current
    CHECK_FALSE(fs::exists(ck / "step_00000020.tmp"));
    check_reads_back((ck / "step_00000020").string(), 2);
  }

  // The resumed run saves again (step 20 once more, then 30): leftovers go, step 20 is replaced.
  auto comm = parallel::make_local_communicator();
  ckpt::Checkpointer writer(run.str(), *comm);
  writer.save(entries_at(3), state_at(20));
  CHECK_FALSE(fs::exists(ck / "step_00000020.tmp"));
  check_reads_back((ck / "step_00000020").string(), 3);
  writer.save(entries_at(4), state_at(30));
  CHECK(file_text(ck / "latest") == "step_00000030\n");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ck)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names ==
        std::vector<std::string>{"latest", "step_00000010", "step_00000020", "step_00000030"});
}

TEST_CASE("a full disk (EFBIG) fails the save with the path and leaves the last checkpoint",
          "[checkpoint]") {
  ScratchDir run("efbig");
  const fs::path ck = run.path / "checkpoints";
  {
    auto comm = parallel::make_local_communicator();
    ckpt::Checkpointer(run.str(), *comm).save(entries_at(1), state_at(10));
  }
  const bool background = GENERATE(false, true);
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const int status = in_child([&] {
    ::close(fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);  // writes past the limit fail with EFBIG instead of a signal
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    auto comm = parallel::make_local_communicator();
    ckpt::Checkpointer writer(run.str(), *comm);
    std::string message = "no error";
    try {
      writer.save(entries_at(2), state_at(20), {.background = background});
      writer.wait();
    } catch (const std::runtime_error& e) {
      message = e.what();
    }
    (void)!::write(fds[1], message.data(), message.size());
    return 0;
  });
  ::close(fds[1]);
  std::string message;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    message.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  REQUIRE(WIFEXITED(status));
  INFO(message);
  CHECK(message == "checkpoint: cannot write " + (ck / "step_00000020.tmp/shard_0.bin").string() +
                       ": File too large");
  CHECK_FALSE(fs::exists(ck / "step_00000020.tmp"));
  CHECK_FALSE(fs::exists(ck / "step_00000020"));
  CHECK(file_text(ck / "latest") == "step_00000010\n");
  check_reads_back(*ckpt::find_latest(run.str()), 1);
}
