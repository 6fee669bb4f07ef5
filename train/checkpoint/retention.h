// Which checkpoints to keep: the keep_last newest (0 keeps all), every step divisible by
// keep_every (0: none), and always the one `latest` names. Applied by rank 0 after `latest`
// moves; a deleted directory is first renamed to step_N.tmp, so a crash halfway through a
// deletion leaves only a .tmp that the next save removes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mod::ckpt {

// The steps (of complete checkpoints) to delete, ascending.
std::vector<int64_t> steps_to_delete(std::vector<int64_t> steps, int keep_last, int keep_every,
                                     std::optional<int64_t> latest_step);

// Deletes them under run_dir/checkpoints; returns the directories deleted. Errors name the path.
std::vector<std::string> apply_retention(const std::string& run_dir, int keep_last, int keep_every);

}  // namespace mod::ckpt
