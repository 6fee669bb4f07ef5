// Metrics across a resume: a run writes steps 1..20, is resumed from its checkpoint at step 10
// and writes 11..20 again; after truncate_after(10) the TensorBoard event files and metrics.csv
// hold every step exactly once, with the resumed run's values for 11..20.
#include <catch2/catch.hpp>
#include <map>

#include "core/util/crc32c.h"
#include "tests/train/checkpoint/helpers.h"
#include "train/metrics/metrics_writer.h"
#include "train/metrics/tb_event.pb.h"

using namespace mod;
using namespace mod::test;

namespace {

// step -> loss values over every event file in dir (checking each record's framing).
std::multimap<int64_t, float> read_events(const fs::path& dir, int* files) {
  std::multimap<int64_t, float> out;
  *files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    ++*files;
    const std::string all = file_text(entry.path());
    size_t pos = 0;
    while (pos < all.size()) {
      uint64_t len;
      uint32_t len_crc, data_crc;
      REQUIRE(pos + 16 <= all.size());
      std::memcpy(&len, all.data() + pos, 8);
      std::memcpy(&len_crc, all.data() + pos + 8, 4);
      REQUIRE(len_crc == crc32c_masked(crc32c(&len, 8)));
      REQUIRE(pos + 16 + len <= all.size());
      std::memcpy(&data_crc, all.data() + pos + 12 + len, 4);
      REQUIRE(data_crc == crc32c_masked(crc32c(all.data() + pos + 12, len)));
      modtrain::tb::Event e;
      REQUIRE(e.ParseFromArray(all.data() + pos + 12, static_cast<int>(len)));
      if (e.has_summary()) out.emplace(e.step(), e.summary().value(0).simple_value());
      pos += 16 + len;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("TensorBoard events after a resume hold each step once", "[checkpoint][metrics]") {
  ScratchDir run("tb");
  const fs::path dir = run.path / "tb";
  {
    metrics::TensorBoardWriter tb(dir.string());
    for (int s = 1; s <= 20; ++s) tb.scalar("loss", s, s);
    tb.flush();
  }
  // A crash mid-record leaves a torn tail: truncation drops it too.
  const fs::path first = fs::directory_iterator(dir)->path();
  std::ofstream(first, std::ios::binary | std::ios::app).write("\x20\x00\x00", 3);

  metrics::TensorBoardWriter::truncate_after(dir.string(), 10);
  {
    metrics::TensorBoardWriter tb(dir.string());  // same second, same pid: a new file anyway
    CHECK(tb.path() != first.string());
    for (int s = 11; s <= 20; ++s) tb.scalar("loss", 100 + s, s);
    tb.flush();
  }
  int files = 0;
  const auto events = read_events(dir, &files);
  CHECK(files == 2);
  REQUIRE(events.size() == 20);
  for (int s = 1; s <= 20; ++s) {
    INFO("step " << s);
    REQUIRE(events.count(s) == 1);
    CHECK(events.find(s)->second == (s <= 10 ? s : 100 + s));
  }
}

TEST_CASE("metrics.csv after a resume holds each step once", "[checkpoint][metrics]") {
  ScratchDir run("csv");
  const std::string path = (run.path / "metrics.csv").string();
  {
    metrics::CsvWriter csv(path, {"lr"});
    for (int s = 1; s <= 20; ++s) csv.row(s, s, {{"lr", 0.5}});
  }
  { std::ofstream(path, std::ios::app) << "21,0.2"; }  // torn by a crash: no newline
  metrics::CsvWriter::truncate_after(path, 10);
  {
    metrics::CsvWriter csv(path, {"lr"});
    for (int s = 11; s <= 20; ++s) csv.row(s, 100 + s, {{"lr", 0.25}});
  }
  std::string expected = "step,loss,lr\n";
  for (int s = 1; s <= 10; ++s) expected += std::to_string(s) + "," + std::to_string(s) + ",0.5\n";
  for (int s = 11; s <= 20; ++s)
    expected += std::to_string(s) + "," + std::to_string(100 + s) + ",0.25\n";
  CHECK(file_text(path) == expected);

  { std::ofstream(path, std::ios::app) << "oops,1\n"; }
  CHECK_THROWS_WITH(metrics::CsvWriter::truncate_after(path, 10),
                    Catch::Contains(path + ":22: expected a step number first, found 'oops,1'"));
}
