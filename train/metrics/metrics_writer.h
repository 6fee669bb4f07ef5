// Run metrics for people and plots: metrics.csv (first columns step, loss; one row per logged
// step, columns fixed by the first row) and a TensorBoard event file with the same scalars
// (and histograms, such as each routed block's router scores).
// Both continue a resumed run: call the writers' truncate_after(checkpoint step) before opening,
// so the steps after the checkpoint, which the resumed run writes again, appear once.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/util/histogram.h"

namespace mod::metrics {

class TensorBoardWriter {
 public:
  // A new file dir/events.out.tfevents.<time>.modtrain.<pid>[.<n>] (never an existing one).
  explicit TensorBoardWriter(const std::string& dir);
  void scalar(const std::string& tag, double value, int64_t step);
  void histogram(const std::string& tag, const util::Histogram& h, int64_t step);
  void flush();
  const std::string& path() const { return path_; }
  // Rewrites every event file in dir without the events of steps > last_kept, and without a
  // torn record at the end (a crash mid-write). Files are replaced atomically (temp + rename).
  // A record that fails its CRC with the file going on past it is corruption, not a torn
  // write: an error naming the file and offset (cutting there would lose every later record).
  static void truncate_after(const std::string& dir, int64_t last_kept);
  // The records of one event file's bytes that truncate_after keeps (path names it in errors).
  static std::string kept_records(const std::string& bytes, int64_t last_kept,
                                  const std::string& path);

 private:
  void write_record(const std::string& bytes);
  std::string path_;
  std::ofstream out_;
};

class CsvWriter {
 public:
  // Opens dir/metrics.csv for appending; `columns` after step and loss. An existing file keeps
  // the columns of its header (a resumed run of an older version writes what that file has).
  CsvWriter(const std::string& path, std::vector<std::string> columns);
  // Values by column name; a missing one is left empty.
  void row(int64_t step, double loss, const std::map<std::string, double>& values);
  // Drops rows with step > last_kept (a resumed run rewrites them) and a torn last line (a crash
  // mid-write); the file is replaced atomically. A missing file is fine.
  static void truncate_after(const std::string& path, int64_t last_kept);
  // The lines of metrics.csv's text that truncate_after keeps (path names it in errors).
  static std::string kept_rows(const std::string& text, int64_t last_kept, const std::string& path);

 private:
  std::vector<std::string> columns_;
  std::ofstream out_;
};

}  // namespace mod::metrics
