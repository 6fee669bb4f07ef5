// metrics.csv and TensorBoard event files: the event file is valid TFRecord framing (lengths
// and payloads with masked CRC-32C) of Event messages carrying our scalars; CSV rows append and
// a resume drops the rows after its step.
#include "train/metrics/metrics_writer.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/util/crc32c.h"
#include "train/metrics/tb_event.pb.h"

using namespace mod;
namespace fs = std::filesystem;

TEST_CASE("CRC-32C matches the standard check value", "[metrics]") {
  const char* s = "123456789";
  CHECK(crc32c(s, 9) == 0xE3069283u);
  CHECK(crc32c(s + 4, 5, crc32c(s, 4)) == 0xE3069283u);  // extends a running value
}

TEST_CASE("TensorBoard event files hold framed, checksummed scalar events", "[metrics]") {
  const fs::path dir = fs::temp_directory_path() / ("modtrain_tb_" + std::to_string(::getpid()));
  std::string path;
  {
    metrics::TensorBoardWriter tb(dir.string());
    tb.scalar("loss", 2.5, 1);
    tb.scalar("loss", 2.25, 2);
    tb.scalar("loss", 0.0, 3);  // a oneof, as in tensorflow: zero is written, not dropped
    tb.histogram("router/block_1", util::make_histogram({-1.0, 0.5, 2.0, 2.0}, 3), 3);
    tb.flush();
    path = tb.path();
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<modtrain::tb::Event> events;
  uint64_t len;
  while (in.read(reinterpret_cast<char*>(&len), 8)) {
    uint32_t len_crc, data_crc;
    in.read(reinterpret_cast<char*>(&len_crc), 4);
    CHECK(len_crc == crc32c_masked(crc32c(&len, 8)));
    std::string data(len, '\0');
    in.read(data.data(), static_cast<std::streamsize>(len));
    in.read(reinterpret_cast<char*>(&data_crc), 4);
    CHECK(data_crc == crc32c_masked(crc32c(data.data(), data.size())));
    modtrain::tb::Event e;
    REQUIRE(e.ParseFromString(data));
    events.push_back(e);
  }
  REQUIRE(events.size() == 5);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[2].step() == 2);
  CHECK(events[2].summary().value(0).tag() == "loss");
  CHECK(events[2].summary().value(0).simple_value() == 2.25f);
  CHECK(events[3].summary().value(0).has_simple_value());
  const auto& h = events[4].summary().value(0);
  CHECK(h.tag() == "router/block_1");
  REQUIRE(h.has_histo());
  CHECK(h.histo().min() == -1.0);
  CHECK(h.histo().max() == 2.0);
  CHECK(h.histo().num() == 4);
  CHECK(h.histo().sum() == 3.5);
  CHECK(h.histo().sum_squares() == 9.25);
  CHECK(std::vector<double>(h.histo().bucket_limit().begin(), h.histo().bucket_limit().end()) ==
        std::vector<double>{0.0, 1.0, 2.0});
  CHECK(std::vector<double>(h.histo().bucket().begin(), h.histo().bucket().end()) ==
        std::vector<double>{1, 1, 2});
  fs::remove_all(dir);
}

TEST_CASE("histograms: equal-width buckets, each from above its lower edge up to its upper, the "
          "minimum in the first",
          "[metrics]") {
  const auto h = util::make_histogram({0.0, 0.25, 0.5, 0.75, 1.0, 1.0}, 4);
  CHECK(h.upper == std::vector<double>{0.25, 0.5, 0.75, 1.0});
  CHECK(h.count == std::vector<double>{2, 1, 1, 2});
  CHECK(h.num == 6);
  const auto flat = util::make_histogram({3.0, 3.0}, 10);
  CHECK(flat.upper == std::vector<double>{3.0});
  CHECK(flat.count == std::vector<double>{2});
  CHECK(util::make_histogram({}, 10).upper.empty());
}

// The bucket comes from a quotient, settled against the bounds: the same counts as a binary
// search over the upper bounds, values on a bound and rounding-prone widths included.
TEST_CASE("histograms count as a binary search over the bounds would", "[metrics]") {
  std::vector<double> values;
  uint64_t state = 12345;
  for (int i = 0; i < 20000; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    values.push_back(static_cast<double>(state >> 11) / 9007199254740992.0 * 0.7 - 0.3);
  }
  const auto probe = util::make_histogram(values, 30);
  values.insert(values.end(), probe.upper.begin(), probe.upper.end());  // exactly on bounds
  for (int buckets : {1, 3, 30, 97}) {
    const auto h = util::make_histogram(values, buckets);
    std::vector<double> want(h.upper.size(), 0.0);
    for (double v : values) {
      const auto it = std::lower_bound(h.upper.begin(), h.upper.end(), v);
      want[std::min<size_t>(it - h.upper.begin(), h.upper.size() - 1)] += 1;
    }
    INFO(buckets << " buckets");
    CHECK(h.count == want);
  }
}

TEST_CASE("metrics.csv starts with step and loss and drops rows past a resume point",
          "[metrics]") {
  const fs::path path = fs::temp_directory_path() / ("modtrain_m_" + std::to_string(::getpid()) + ".csv");
  fs::remove(path);
  {
    metrics::CsvWriter csv(path.string(), {"lr", "val_loss"});
    for (int s = 1; s <= 4; ++s) csv.row(s, 5.0 - s, {{"lr", 0.1}});
  }
  metrics::CsvWriter::truncate_after(path.string(), 2);
  {
    metrics::CsvWriter csv(path.string(), {"lr", "val_loss"});
    csv.row(3, 1.5, {{"lr", 0.2}, {"val_loss", 1.25}});
  }
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  CHECK(all == "step,loss,lr,val_loss\n1,4,0.1,\n2,3,0.1,\n3,1.5,0.2,1.25\n");
  fs::remove(path);
}

TEST_CASE("metrics.csv writes 9 significant digits, enough for any float", "[metrics]") {
  const fs::path path =
      fs::temp_directory_path() / ("modtrain_csv9_" + std::to_string(::getpid()) + ".csv");
  fs::remove(path);
  const float loss = 3.14159274f, lr = 2.00150003e-4f;  // 6 digits would round both
  {
    metrics::CsvWriter csv(path.string(), {"lr"});
    csv.row(1, loss, {{"lr", lr}});
  }
  std::ifstream in(path);
  std::string header, row;
  std::getline(in, header);
  std::getline(in, row);
  CHECK(row == "1,3.14159274,0.000200149996");
  const size_t a = row.find(','), b = row.find(',', a + 1);
  CHECK(std::stof(row.substr(a + 1, b - a - 1)) == loss);
  CHECK(std::stof(row.substr(b + 1)) == lr);
  fs::remove(path);
}

TEST_CASE("metrics.csv continued by a version with a new column keeps the file's own columns",
          "[metrics]") {
  const fs::path path =
      fs::temp_directory_path() / ("modtrain_mc_" + std::to_string(::getpid()) + ".csv");
  fs::remove(path);
  {
    metrics::CsvWriter csv(path.string(), {"lr", "mfu"});  // an older run: no peak_memory_mb
    csv.row(1, 4.0, {{"lr", 0.1}, {"mfu", 0.5}});
  }
  {
    metrics::CsvWriter csv(path.string(), {"lr", "mfu", "peak_memory_mb"});
    csv.row(2, 3.0, {{"lr", 0.2}, {"mfu", 0.25}, {"peak_memory_mb", 64}});
  }
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  CHECK(all == "step,loss,lr,mfu\n1,4,0.1,0.5\n2,3,0.2,0.25\n");
  fs::remove(path);
}
