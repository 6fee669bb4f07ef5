// Checkpoint retention (see retention.h).
#include "train/checkpoint/retention.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "core/util/file_io.h"
#include "train/checkpoint/checkpoint.h"

namespace mod::ckpt {

std::vector<int64_t> steps_to_delete(std::vector<int64_t> steps, int keep_last, int keep_every,
                                     std::optional<int64_t> latest_step) {
  std::sort(steps.begin(), steps.end());
  std::vector<int64_t> out;
  const int64_t n = static_cast<int64_t>(steps.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = steps[i];
    const bool newest = keep_last <= 0 || i >= n - keep_last;
    const bool milestone = keep_every > 0 && s % keep_every == 0;
    if (!newest && !milestone && s != latest_step) out.push_back(s);
  }
  return out;
}

std::vector<std::string> apply_retention(const std::string& run_dir, int keep_last,
                                         int keep_every) {
  if (keep_last <= 0) return {};
  std::optional<int64_t> latest_step;
  if (auto latest = find_latest(run_dir))
    latest_step = parse_step_dir_name(std::filesystem::path(*latest).filename().string());
  std::vector<int64_t> steps;
  for (const auto& [step, _] : list_checkpoints(run_dir)) steps.push_back(step);
  std::vector<std::string> deleted;
  for (int64_t step : steps_to_delete(steps, keep_last, keep_every, latest_step)) {
    const std::string dir = checkpoints_dir(run_dir) + "/" + step_dir_name(step);
    std::error_code ec;
    std::filesystem::remove_all(dir + ".tmp", ec);  // a leftover of the same name
    util::rename_path(dir, dir + ".tmp");
    std::filesystem::remove_all(dir + ".tmp", ec);
    if (ec) throw std::runtime_error("checkpoint: cannot remove " + dir + ".tmp: " + ec.message());
    deleted.push_back(dir);
  }
  return deleted;
}

}  // namespace mod::ckpt
