// Checkpoint export to safetensors (see export.h).
#include "train/checkpoint/export.h"

#include <stdexcept>
#include <utility>
#include <vector>

#include "configs/config.h"
#include "core/util/safetensors.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/reader.h"
#include "train/weights.h"

namespace mod::ckpt {

ExportSummary export_safetensors(const std::string& from, const std::string& out_path) {
  const CheckpointReader reader(resolve_checkpoint(from));
  const std::string prefix = "model/";
  std::vector<std::pair<std::string, Tensor>> tensors;
  ExportSummary summary{reader.dir(), reader.state().step, 0, 0};
  for (const std::string& name : reader.tensor_names()) {
    if (name.rfind(prefix, 0) != 0) continue;
    tensors.emplace_back(name.substr(prefix.size()), reader.read_full(name));
    ++summary.tensors;
    summary.bytes += static_cast<int64_t>(tensors.back().second.nbytes());
  }
  if (tensors.empty())
    throw std::runtime_error("checkpoint " + reader.metadata_path() +
                             ": no model/* tensors to export");
  save_safetensors(out_path, tensors,
                   train::weights_metadata(reader.state().config, reader.state().step,
                                           reader.state().tokenizer_crc32c));
  return summary;
}

}  // namespace mod::ckpt
