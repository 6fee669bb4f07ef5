// Run-directory inspection (see run_state.h).
#include "grid/run_state.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "train/weights.h"

namespace mod::grid {

namespace fs = std::filesystem;

const char* status_name(RunStatus s) {
  switch (s) {
    case RunStatus::NotStarted: return "not started";
    case RunStatus::Partial: return "partial";
    case RunStatus::Finished: return "finished";
  }
  return "?";
}


namespace {

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) out.push_back(cell);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

void read_metrics(const std::string& path, int64_t steps, int64_t tokens_per_step, RunState& st) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return;
  const auto header = split_csv(line);
  int val_col = -1, causal_col = -1, tps_col = -1;
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == "val_loss") val_col = static_cast<int>(i);
    if (header[i] == "val_loss_causal") causal_col = static_cast<int>(i);
    if (header[i] == "tokens_per_s") tps_col = static_cast<int>(i);
  }
  while (std::getline(in, line)) {
    const auto cells = split_csv(line);
    if (cells.empty() || cells[0].empty()) continue;
    try {
      const int64_t step = std::stoll(cells[0]);
      st.metrics_step = step;
      if (tps_col >= 0 && tps_col < static_cast<int>(cells.size()) && !cells[tps_col].empty()) {
        const double tps = std::stod(cells[tps_col]);
        if (tps > 0) st.train_seconds += static_cast<double>(tokens_per_step) / tps;
      }
      auto final_value = [&](int col, std::optional<double>& out) {
        if (step == steps && col >= 0 && col < static_cast<int>(cells.size()) &&
            !cells[col].empty())
          out = std::stod(cells[col]);
      };
      final_value(val_col, st.final_val_loss);
      final_value(causal_col, st.final_val_loss_causal);
    } catch (const std::exception&) {
      continue;  // a torn last line of an interrupted run
    }
  }
}

}  // namespace

RunState inspect_run(const std::string& run_dir, int64_t steps, int64_t tokens_per_step) {
  RunState st;
  if (!fs::is_directory(run_dir)) return st;
  st.weights_step = train::weights_step(run_dir + "/model.safetensors");
  std::ifstream latest(run_dir + "/checkpoints/latest");
  std::string name;
  if (latest >> name && name.rfind("step_", 0) == 0) {
    try {
      st.checkpoint_step = std::stoll(name.substr(5));
    } catch (const std::exception&) {
    }
  }
  read_metrics(run_dir + "/metrics.csv", steps, tokens_per_step, st);
  if (st.weights_step == steps)
    st.status = RunStatus::Finished;
  else if (st.checkpoint_step > 0 || st.metrics_step > 0 || st.weights_step >= 0)
    st.status = RunStatus::Partial;
  if (st.status != RunStatus::Finished) {
    st.final_val_loss.reset();
    st.final_val_loss_causal.reset();
  }
  return st;
}

std::string RunState::describe() const {
  const std::string s = status_name(status);
  return status == RunStatus::Partial ? s + ": " + details() : s;
}

std::string RunState::details() const {
  std::string s;
  std::vector<std::string> parts;
  if (checkpoint_step >= 0) parts.push_back("checkpoint at step " + std::to_string(checkpoint_step));
  if (metrics_step >= 0) parts.push_back("metrics to step " + std::to_string(metrics_step));
  if (weights_step >= 0)
    parts.push_back("model.safetensors at step " + std::to_string(weights_step) +
                    " (another step count: was the spec changed?)");
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
  return s;
}

}  // namespace mod::grid
