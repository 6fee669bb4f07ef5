// A run's metrics.csv read back by tests: its rows as text cells, a column by its header name.
#pragma once
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace mod::test {

// One line's comma-separated cells (metrics.csv quotes nothing).
inline std::vector<std::string> csv_cells(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  for (std::string cell; std::getline(ss, cell, ',');) out.push_back(cell);
  return out;
}

// Every non-empty line's cells; the header is row 0.
inline std::vector<std::vector<std::string>> metrics_rows(const std::string& path) {
  std::ifstream in(path);
  INFO("reading " << path);
  REQUIRE(in.good());
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(csv_cells(line));
  REQUIRE(!rows.empty());
  return rows;
}

inline bool metrics_has_column(const std::string& path, const std::string& column) {
  const std::vector<std::string> header = metrics_rows(path).front();
  return std::find(header.begin(), header.end(), column) != header.end();
}

// Column `column`'s cell in each row after the header, "" where the row stops short of it
// (a step row's evaluation columns). The column must exist.
inline std::vector<std::string> metrics_cells(const std::string& path, const std::string& column) {
  const std::vector<std::vector<std::string>> rows = metrics_rows(path);
  const std::vector<std::string>& header = rows.front();
  const size_t at = std::find(header.begin(), header.end(), column) - header.begin();
  INFO(path << ": column " << column);
  REQUIRE(at < header.size());
  std::vector<std::string> out;
  for (size_t r = 1; r < rows.size(); ++r) out.push_back(at < rows[r].size() ? rows[r][at] : "");
  return out;
}

// The same as numbers, an empty cell as NaN.
inline std::vector<double> metrics_values(const std::string& path, const std::string& column) {
  std::vector<double> out;
  for (const std::string& cell : metrics_cells(path, column))
    out.push_back(cell.empty() ? std::nan("") : std::stod(cell));
  return out;
}

}  // namespace mod::test
