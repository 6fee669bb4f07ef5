// Checkpoint directory layout: names, listing, `latest` and resolving a path (see checkpoint.h).
#include "train/checkpoint/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "core/util/file_io.h"
#include "train/checkpoint/checkpoint.pb.h"
#include "train/checkpoint/metadata.h"

namespace mod::ckpt {

namespace fs = std::filesystem;

std::string checkpoints_dir(const std::string& run_dir) {
  return run_dir + "/checkpoints";
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  constexpr size_t kPrefix = 5;  // "step_"
  if (name.size() < kPrefix + 8 || name.compare(0, kPrefix, "step_") != 0) return std::nullopt;
  const std::string digits = name.substr(kPrefix);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  const std::string dir = checkpoints_dir(run_dir);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto step = parse_step_dir_name(e.path().filename().string());
    if (step && e.is_directory()) out.emplace_back(*step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> find_latest(const std::string& run_dir) {
  const std::string latest = checkpoints_dir(run_dir) + "/latest";
  if (!fs::exists(latest)) return std::nullopt;
  std::string name = util::read_file(latest);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (!parse_step_dir_name(name))
    throw std::runtime_error("checkpoint " + latest + ": '" + name +
                             "' is not a checkpoint directory name (step_NNNNNNNN)");
  const std::string dir = checkpoints_dir(run_dir) + "/" + name;
  const std::string meta_path = dir + "/" + kMetadataFile;
  if (!fs::exists(meta_path))
    throw std::runtime_error("checkpoint " + latest + " names " + dir + ", which has no " +
                             kMetadataFile);
  modtrain::ckpt::CheckpointMeta meta;
  if (!meta.ParseFromString(util::read_file(meta_path)))
    throw std::runtime_error("checkpoint " + meta_path + ": cannot parse (named by " + latest +
                             ")");
  return dir;
}

std::string resolve_checkpoint(const std::string& path) {
  if (fs::exists(path + "/" + kMetadataFile)) return path;
  if (fs::exists(checkpoints_dir(path) + "/latest")) return *find_latest(path);
  throw std::runtime_error("checkpoint " + path + ": neither a checkpoint directory (no " +
                           kMetadataFile + ") nor a run directory (no checkpoints/latest)");
}

}  // namespace mod::ckpt
