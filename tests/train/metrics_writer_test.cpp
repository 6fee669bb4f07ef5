// metrics.csv and TensorBoard event files: the event file is valid TFRecord framing (lengths
// and payloads with masked CRC-32C) of Event messages carrying our scalars; CSV rows append and
// a resume drops the rows after its step.
#include "train/metrics/metrics_writer.h"

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
  REQUIRE(events.size() == 3);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[2].step() == 2);
  CHECK(events[2].summary().value(0).tag() == "loss");
  CHECK(events[2].summary().value(0).simple_value() == 2.25f);
  fs::remove_all(dir);
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
