// metrics.csv and TensorBoard event files (TFRecord framing: length, masked CRC-32C of the
// length, payload, masked CRC-32C of the payload).
#include "train/metrics/metrics_writer.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "core/util/atomic_file.h"
#include "core/util/crc32c.h"
#include "train/metrics/tb_event.pb.h"

namespace mod::metrics {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string base = dir + "/events.out.tfevents." +
                           std::to_string(static_cast<int64_t>(now_seconds())) + ".modtrain." +
                           std::to_string(::getpid());
  path_ = base;
  for (int n = 1; std::filesystem::exists(path_); ++n) path_ = base + "." + std::to_string(n);
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

void TensorBoardWriter::histogram(const std::string& tag, const util::Histogram& h, int64_t step) {
  modtrain::tb::Event e;
  e.set_wall_time(now_seconds());
  e.set_step(step);
  auto* v = e.mutable_summary()->add_value();
  v->set_tag(tag);
  auto* histo = v->mutable_histo();
  histo->set_min(h.min);
  histo->set_max(h.max);
  histo->set_num(h.num);
  histo->set_sum(h.sum);
  histo->set_sum_squares(h.sum_squares);
  for (size_t i = 0; i < h.upper.size(); ++i) {
    histo->add_bucket_limit(h.upper[i]);
    histo->add_bucket(h.count[i]);
  }
  write_record(e.SerializeAsString());
}

void TensorBoardWriter::flush() { out_.flush(); }

void TensorBoardWriter::truncate_after(const std::string& dir, int64_t last_kept) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) != 0) continue;
    const std::string path = entry.path().string();
    if (entry.path().extension() == ".tmp") {  // a rewrite cut short by a crash
      std::filesystem::remove(entry.path());
      continue;
    }
    std::ifstream in(path, std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(in)), {});
    const std::string kept = kept_records(all, last_kept, path);
    if (kept.size() != all.size()) util::replace_file(path, kept);
  }
}

std::string TensorBoardWriter::kept_records(const std::string& all, int64_t last_kept,
                                            const std::string& path) {
  std::string kept;
  size_t pos = 0;
  auto corrupt = [&](const std::string& what) {
    throw std::runtime_error("tensorboard " + path + ": record at byte " + std::to_string(pos) +
                             ": " + what + "; the file is corrupt (not cut short by a crash), so "
                             "it is kept as it is and the resume stops: move it aside to go on");
  };
  // Record: u64 length, masked CRC of the length, payload, masked CRC of the payload. Only a
  // record running past the end of the file is a torn write (a crash mid-append).
  while (pos + 12 <= all.size()) {
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, all.data() + pos, 8);
    std::memcpy(&len_crc, all.data() + pos + 8, 4);
    if (len_crc != crc32c_masked(crc32c(&len, 8))) corrupt("length CRC mismatch");
    if (len > all.size() - pos - 12 || all.size() - pos - 12 - len < 4) break;  // torn
    const char* data = all.data() + pos + 12;
    std::memcpy(&data_crc, data + len, 4);
    if (data_crc != crc32c_masked(crc32c(data, len))) corrupt("payload CRC mismatch");
    modtrain::tb::Event e;
    if (len > static_cast<uint64_t>(INT32_MAX) || !e.ParseFromArray(data, static_cast<int>(len)))
      corrupt("CRC-valid payload is not an Event");
    if (e.step() <= last_kept) kept.append(all, pos, 16 + len);
    pos += 16 + len;
  }
  return kept;
}

CsvWriter::CsvWriter(const std::string& path, std::vector<std::string> columns)
    : columns_(std::move(columns)) {
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  // A continued file keeps its own header: a column added since it was started is left out,
  // one it has that is no longer reported stays empty, and every row lines up.
  if (!fresh) {
    std::ifstream in(path);
    std::string header, cell;
    std::getline(in, header);
    std::istringstream cells(header);
    std::vector<std::string> existing;
    for (int i = 0; std::getline(cells, cell, ','); ++i)
      if (i >= 2) existing.push_back(cell);  // after step, loss
    columns_ = std::move(existing);
  }
  out_.open(path, std::ios::app);
  if (!out_) throw std::runtime_error("metrics: cannot open " + path);
  // 9 significant digits hold every float exactly, so a run can be checked from outside to
  // float32 rounding (the stream's default 6 capped such a check at 5e-6).
  out_ << std::setprecision(9);
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
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  const std::string all((std::istreambuf_iterator<char>(in)), {});
  in.close();
  const std::string kept = kept_rows(all, last_kept, path);
  if (kept.size() != all.size()) util::replace_file(path, kept);
}

std::string CsvWriter::kept_rows(const std::string& all, int64_t last_kept, const std::string& path) {
  std::string kept;
  size_t begin = 0, line_no = 0;
  // Only complete lines: a last line without its newline was torn by a crash.
  for (size_t end; (end = all.find('\n', begin)) != std::string::npos; begin = end + 1) {
    const std::string line = all.substr(begin, end - begin);
    if (line_no++ > 0) {
      if (line.empty()) continue;
      size_t used = 0;
      int64_t step = 0;
      try {
        step = std::stoll(line, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used >= line.size() || line[used] != ',' || step < 0)
        throw std::runtime_error("metrics: " + path + ":" + std::to_string(line_no) +
                                 ": expected a step number first, found '" + line.substr(0, 80) +
                                 "'");
      if (step > last_kept) continue;
    }
    kept += line + "\n";
  }
  return kept;
}

}  // namespace mod::metrics
