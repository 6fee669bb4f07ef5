// Checkpoint reading with resharding, and the model-compatibility check (see reader.h).
#include "train/checkpoint/reader.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/text_format.h>

#include <filesystem>
#include <stdexcept>

#include "core/util/file_io.h"
#include "train/checkpoint/box.h"
#include "train/checkpoint/checkpoint.pb.h"
#include "train/checkpoint/metadata.h"
#include "train/checkpoint/shard_file.h"

namespace mod::ckpt {

namespace gpb = google::protobuf;

namespace {

std::string field_text(const gpb::Message& m, const gpb::FieldDescriptor* f, int index) {
  std::string out;
  gpb::TextFormat::PrintFieldValueToString(m, f, index, &out);
  return out;
}

// Depth-first over every field (unset ones by their defaults), so a default and an explicit
// value equal to it compare equal.
std::optional<std::string> first_difference(const gpb::Message& a, const gpb::Message& b,
                                            const std::string& path) {
  const gpb::Descriptor* d = a.GetDescriptor();
  const gpb::Reflection* ra = a.GetReflection();
  const gpb::Reflection* rb = b.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const gpb::FieldDescriptor* f = d->field(i);
    const std::string here = path + "." + f->name();
    if (f->is_repeated()) {
      const int na = ra->FieldSize(a, f), nb = rb->FieldSize(b, f);
      for (int k = 0; k < std::min(na, nb); ++k) {
        const std::string at = here + "[" + std::to_string(k) + "]";
        if (f->cpp_type() == gpb::FieldDescriptor::CPPTYPE_MESSAGE) {
          if (auto diff = first_difference(ra->GetRepeatedMessage(a, f, k),
                                           rb->GetRepeatedMessage(b, f, k), at))
            return diff;
        } else if (field_text(a, f, k) != field_text(b, f, k)) {
          return at + ": " + field_text(a, f, k) + " in the checkpoint, " + field_text(b, f, k) +
                 " now";
        }
      }
      if (na != nb)
        return here + ": " + std::to_string(na) + " values in the checkpoint, " +
               std::to_string(nb) + " now";
    } else if (f->cpp_type() == gpb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (auto diff = first_difference(ra->GetMessage(a, f), rb->GetMessage(b, f), here))
        return diff;
    } else if (field_text(a, f, -1) != field_text(b, f, -1)) {
      return here + ": " + field_text(a, f, -1) + " in the checkpoint, " + field_text(b, f, -1) +
             " now";
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> model_difference(const modtrain::ModelConfig& saved,
                                            const modtrain::ModelConfig& current) {
  return first_difference(saved, current, "model");
}

struct CheckpointReader::Index {
  std::map<std::string, modtrain::ckpt::TensorInfo> tensors;
};

CheckpointReader::CheckpointReader(const std::string& dir)
    : dir_(dir), metadata_path_(dir + "/" + kMetadataFile), index_(std::make_unique<Index>()) {
  if (!std::filesystem::exists(metadata_path_))
    throw std::runtime_error("checkpoint " + metadata_path_ +
                             ": missing (not a checkpoint directory, or an unfinished one)");
  modtrain::ckpt::CheckpointMeta meta =
      open_meta(util::read_file(metadata_path_), "checkpoint " + metadata_path_);
  state_ = state_from_meta(meta);
  for (auto& t : *meta.mutable_tensors()) {
    const std::string name = t.name();
    if (!index_->tensors.emplace(name, std::move(t)).second)
      throw std::runtime_error("checkpoint " + metadata_path_ + ": tensor " + name +
                               " is listed twice");
  }
}

CheckpointReader::~CheckpointReader() = default;

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : index_->tensors) out.push_back(name);
  return out;
}

bool CheckpointReader::has(const std::string& name) const {
  return index_->tensors.count(name) > 0;
}

namespace {
const modtrain::ckpt::TensorInfo& lookup(const std::map<std::string, modtrain::ckpt::TensorInfo>& m,
                                         const std::string& name, const std::string& meta_path) {
  auto it = m.find(name);
  if (it == m.end())
    throw std::runtime_error("checkpoint " + meta_path + ": tensor " + name +
                             ": unknown (not in this checkpoint)");
  return it->second;
}
}  // namespace

Shape CheckpointReader::global_shape(const std::string& name) const {
  const auto& t = lookup(index_->tensors, name, metadata_path_);
  return Shape(t.global_shape().begin(), t.global_shape().end());
}

DType CheckpointReader::dtype(const std::string& name) const {
  return parse_dtype(lookup(index_->tensors, name, metadata_path_).dtype(), metadata_path_);
}

Tensor CheckpointReader::read(const std::string& name, const Shape& local_shape, int shard_dim,
                              int64_t offset, DType want) const {
  const auto& info = lookup(index_->tensors, name, metadata_path_);
  const std::string where = "checkpoint " + metadata_path_ + ": tensor " + name;
  const Shape global(info.global_shape().begin(), info.global_shape().end());
  const DType saved = parse_dtype(info.dtype(), where);
  const int nd = static_cast<int>(global.size());
  bool fits = static_cast<int>(local_shape.size()) == nd && shard_dim >= -1 && shard_dim < nd;
  for (int d = 0; fits && d < nd; ++d)
    fits = d == shard_dim
               ? offset >= 0 && local_shape[d] >= 0 && offset + local_shape[d] <= global[d]
               : local_shape[d] == global[d];
  if (!fits)
    throw std::runtime_error(where + ": requested " + shape_str(local_shape) +
                             (shard_dim >= 0 ? " at offset " + std::to_string(offset) +
                                                   " along dim " + std::to_string(shard_dim)
                                             : std::string(" whole")) +
                             " does not fit its saved shape " + shape_str(global));
  const bool convertible =
      (saved == DType::F32 || saved == DType::F64) && (want == DType::F32 || want == DType::F64);
  if (saved != want && !convertible)
    throw std::runtime_error(where + ": saved as " + dtype_name(saved) + ", requested as " +
                             dtype_name(want));

  const Box box = slab_box(local_shape, shard_dim, offset);
  Tensor out = Tensor::empty(local_shape, saved);
  int64_t copied = 0;
  for (const auto& piece : info.pieces()) {
    const Shape piece_shape(piece.local_shape().begin(), piece.local_shape().end());
    const Box piece_box = slab_box(piece_shape, piece.shard_dim(), piece.offset());
    const Box region = intersect(box, piece_box);
    if (box_numel(region) == 0) continue;
    const Tensor data = read_piece(dir_, name, saved, piece);
    copy_box(data.raw_data(), piece_box, out.raw_data(), box, region, dtype_size(saved));
    copied += box_numel(region);
  }
  if (copied != shape_numel(local_shape))  // validate_index makes this unreachable
    throw std::runtime_error(where + ": the saved pieces cover " + std::to_string(copied) + " of " +
                             std::to_string(shape_numel(local_shape)) + " requested elements");
  return saved == want ? out : out.to(want);
}

Tensor CheckpointReader::read_full(const std::string& name) const {
  return read(name, global_shape(name), -1, 0, dtype(name));
}

void CheckpointReader::check_compatible(const modtrain::RunConfig& current) const {
  if (auto diff = model_difference(state_.config.model(), current.model()))
    throw std::runtime_error("checkpoint " + metadata_path_ +
                             ": the model differs from the run's: " + *diff);
}

}  // namespace mod::ckpt
