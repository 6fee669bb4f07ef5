// metrics.csv and TensorBoard event files (TFRecord framing: length, masked CRC-32C of the
// length, payload, masked CRC-32C of the payload).
#include "core/metrics/metrics_writer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "core/metrics/tb_event.pb.h"
#include "core/util/crc32c.h"

namespace mod::metrics {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) +
          ".modtrain." + std::to_string(::getpid());
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw std::runtime_error("tensorboard: cannot open " + path_);
  modtrain::tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_file_version("brain.Event:2");
  write_record(e.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& bytes) {
  const uint64_t len = bytes.size();
  const uint32_t len_crc = crc32c_masked(crc32c(&len, sizeof len));
  const uint32_t data_crc = crc32c_masked(crc32c(bytes.data(), bytes.size()));
  out_.write(reinterpret_cast<const char*>(&len), sizeof len);
  out_.write(reinterpret_cast<const char*>(&len_crc), sizeof len_crc);
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), sizeof data_crc);
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  modtrain::tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write_record(e.SerializeAsString());
}

void TensorBoardWriter::flush() { out_.flush(); }

CsvWriter::CsvWriter(const std::string& path, std::vector<std::string> columns)
    : columns_(std::move(columns)) {
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  out_.open(path, std::ios::app);
  if (!out_) throw std::runtime_error("metrics: cannot open " + path);
  if (fresh) {
    out_ << "step,loss";
    for (const auto& c : columns_) out_ << "," << c;
    out_ << "\n";
  }
}

void CsvWriter::row(int64_t step, double loss, const std::map<std::string, double>& values) {
  out_ << step << "," << loss;
  for (const auto& c : columns_) {
    out_ << ",";
    auto it = values.find(c);
    if (it != values.end() && std::isfinite(it->second)) out_ << it->second;
  }
  out_ << "\n";
  out_.flush();
}

void CsvWriter::truncate_after(const std::string& path, int64_t last_kept) {
  std::ifstream in(path);
  if (!in) return;
  std::ostringstream kept;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (!header) {
      const int64_t step = std::stoll(line.substr(0, line.find(',')));
      if (step > last_kept) continue;
    }
    kept << line << "\n";
    header = false;
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  out << kept.str();
}

}  // namespace mod::metrics
