// Run metrics for people and plots: metrics.csv (first columns step, loss; one row per logged
// step, columns fixed by the first row) and a TensorBoard event file with the same scalars.
// Both append, so a resumed run continues the same files; rows at or before `resume_step` are
// never written twice.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace mod::metrics {

class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);  // events.out.tfevents.<time>.modtrain
  void scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& bytes);
  std::string path_;
  std::ofstream out_;
};

class CsvWriter {
 public:
  // Opens dir/metrics.csv for appending; `columns` after step and loss.
  CsvWriter(const std::string& path, std::vector<std::string> columns);
  // Values by column name; a missing one is left empty.
  void row(int64_t step, double loss, const std::map<std::string, double>& values);
  // Drops rows with step > last_kept (a resumed run rewrites them).
  static void truncate_after(const std::string& path, int64_t last_kept);

 private:
  std::vector<std::string> columns_;
  std::ofstream out_;
};

}  // namespace mod::metrics
