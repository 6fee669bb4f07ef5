// Checkpoint metadata conversion, merging and validation (see metadata.h).
#include "train/checkpoint/metadata.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/unknown_field_set.h>

#include "configs/config.h"
#include "core/util/crc32c.h"
#include "train/checkpoint/box.h"

namespace mod::ckpt {

namespace pb = modtrain::ckpt;

DType parse_dtype(const std::string& name, const std::string& where) {
  for (DType t : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16})
    if (name == dtype_name(t)) return t;
  throw std::runtime_error(where + ": dtype '" + name + "' is not one of f32, f64, i32, i64, bf16");
}

std::vector<pb::TensorInfo> merge_pieces(const std::vector<pb::RankPieces>& ranks) {
  std::map<std::string, pb::TensorInfo> by_name;
  for (const pb::RankPieces& r : ranks)
    for (const pb::TensorInfo& t : r.tensors()) {
      auto [it, fresh] = by_name.try_emplace(t.name(), t);
      if (fresh) continue;
      pb::TensorInfo& merged = it->second;
      const bool same_shape = std::equal(merged.global_shape().begin(), merged.global_shape().end(),
                                         t.global_shape().begin(), t.global_shape().end());
      if (merged.dtype() != t.dtype() || !same_shape)
        throw std::runtime_error(
            "checkpoint: tensor " + t.name() + ": saved as " + merged.dtype() +
            shape_str(Shape(merged.global_shape().begin(), merged.global_shape().end())) +
            " by one entry and " + t.dtype() +
            shape_str(Shape(t.global_shape().begin(), t.global_shape().end())) + " by another");
      for (const pb::Piece& p : t.pieces()) *merged.add_pieces() = p;
    }
  std::vector<pb::TensorInfo> out;
  for (auto& [_, t] : by_name) out.push_back(std::move(t));
  return out;
}

pb::CheckpointMeta make_meta(const TrainState& s, std::vector<pb::TensorInfo> tensors) {
  pb::CheckpointMeta m;
  m.set_format_version(kFormatVersion);
  *m.mutable_config() = s.config;
  m.set_step(s.step);
  m.set_tokens_seen(s.tokens_seen);
  m.mutable_loader()->set_seed(s.loader_seed);
  m.mutable_loader()->set_batches_drawn(s.batches_drawn);
  for (const data::ShardFingerprint& f : s.data_shards) {
    pb::DataShard* d = m.mutable_loader()->add_train_shards();
    d->set_name(f.name);
    d->set_tokens(f.tokens);
    d->set_crc32c(f.crc32c);
    d->set_sample_crc(f.sample_crc);
  }
  for (uint64_t w : s.rng_state) m.add_rng_state(w);
  m.mutable_mesh()->set_dp(s.mesh.dp);
  m.mutable_mesh()->set_tp(s.mesh.tp);
  m.mutable_mesh()->set_zero1(s.mesh.zero_stage >= 1);
  m.mutable_mesh()->set_zero_stage(s.mesh.zero_stage);
  m.mutable_mesh()->set_world_size(s.mesh.world_size);
  m.mutable_mesh()->set_pp(s.mesh.pp);
  m.mutable_progress()->set_elapsed_seconds(s.elapsed_seconds);
  m.mutable_progress()->set_last_metrics_step(s.last_metrics_step);
  m.set_optimizer_steps(s.optimizer_steps);
  if (s.tokenizer_crc32c) m.set_tokenizer_crc32c(*s.tokenizer_crc32c);
  for (auto& t : tensors) *m.add_tensors() = std::move(t);
  return m;
}

TrainState state_from_meta(const pb::CheckpointMeta& m) {
  TrainState s;
  s.config = m.config();
  s.step = m.step();
  s.tokens_seen = m.tokens_seen();
  s.loader_seed = m.loader().seed();
  s.batches_drawn = m.loader().batches_drawn();
  for (const pb::DataShard& d : m.loader().train_shards())
    s.data_shards.push_back({d.name(), d.tokens(), d.crc32c(), d.sample_crc()});
  s.rng_state.assign(m.rng_state().begin(), m.rng_state().end());
  const int stage = m.mesh().zero_stage() > 0 ? m.mesh().zero_stage() : m.mesh().zero1() ? 1 : 0;
  s.mesh = {m.mesh().dp(), m.mesh().tp(), stage, m.mesh().world_size(), std::max(1, m.mesh().pp())};
  s.elapsed_seconds = m.progress().elapsed_seconds();
  s.last_metrics_step = m.progress().last_metrics_step();
  s.optimizer_steps = m.optimizer_steps();
  if (m.has_tokenizer_crc32c()) s.tokenizer_crc32c = m.tokenizer_crc32c();
  return s;
}

namespace {
// Deterministic bytes of meta without its checksum: what the checksum covers.
uint32_t meta_crc(const pb::CheckpointMeta& meta) {
  pb::CheckpointMeta copy = meta;
  copy.clear_meta_crc32c();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    copy.SerializeToCodedStream(&out);
  }
  return crc32c(bytes.data(), bytes.size());
}

int64_t checked_numel(const Shape& s, const std::function<void(const std::string&)>& bad) {
  try {
    return shape_numel(s);
  } catch (const std::invalid_argument& e) {
    bad(e.what());
  }
  return 0;
}
}  // namespace

std::string seal_meta(pb::CheckpointMeta& meta) {
  meta.set_meta_crc32c(meta_crc(meta));
  std::string bytes;
  google::protobuf::io::StringOutputStream raw(&bytes);
  {
    google::protobuf::io::CodedOutputStream out(&raw);
    out.SetSerializationDeterministic(true);
    meta.SerializeToCodedStream(&out);
  }
  return bytes;
}

pb::CheckpointMeta open_meta(const std::string& bytes, const std::string& where) {
  pb::CheckpointMeta meta;
  if (!meta.ParseFromString(bytes)) throw std::runtime_error(where + ": cannot parse as CheckpointMeta");
  if (meta.format_version() != kFormatVersion)
    throw std::runtime_error(where + ": format version " + std::to_string(meta.format_version()) +
                             ", this build reads " + std::to_string(kFormatVersion));
  if (meta.has_meta_crc32c() && meta.meta_crc32c() != meta_crc(meta))
    throw std::runtime_error(where + ": metadata checksum mismatch (step, optimizer state or "
                             "index corrupted); refusing to resume from it");
  if (meta.has_meta_crc32c() && !meta.GetReflection()->GetUnknownFields(meta).empty())
    throw std::runtime_error(where + ": fields this build does not know (corrupt or newer)");
  if (meta.step() < 0 || meta.optimizer_steps() < 0 || meta.tokens_seen() < 0 ||
      meta.loader().batches_drawn() < 0 || meta.progress().last_metrics_step() < 0 ||
      !(meta.progress().elapsed_seconds() >= 0))
    throw std::runtime_error(where + ": negative step, token, batch or time count");
  // Builds before parallel.zero1 and parallel.zero_stage became exclusive saved both where they
  // agreed: such a config reads as zero_stage alone, so their checkpoints still load.
  if (meta.has_config() && meta.config().has_parallel()) {
    const auto& p = meta.config().parallel();
    if (p.has_zero1() && p.has_zero_stage() && p.zero_stage() == (p.zero1() ? 1 : 0))
      meta.mutable_config()->mutable_parallel()->clear_zero1();
  }
  try {
    config::validate_from(meta.config(), where + " (embedded config)");
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  validate_index(meta, where);
  return meta;
}

void check_shard_header(const unsigned char header[64], uint64_t file_bytes,
                        const std::string& where) {
  static constexpr char kMagic[8] = {'M', 'O', 'D', 'S', 'H', 'A', 'R', 'D'};
  uint32_t version = 0;
  uint64_t pieces = 0;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&pieces, header + 16, 8);
  if (file_bytes < 64 || std::memcmp(header, kMagic, 8) != 0)
    throw std::runtime_error(where + "not a modtrain shard file (no MODSHARD header)");
  if (version != static_cast<uint32_t>(kFormatVersion))
    throw std::runtime_error(where + "shard format version " + std::to_string(version) +
                             ", this build reads " + std::to_string(kFormatVersion));
  // Each piece starts 64-byte aligned after the header, so a file holds at most this many.
  if (pieces > (file_bytes - 64) / 64 + 1)
    throw std::runtime_error(where + "header claims " + std::to_string(pieces) +
                             " pieces in a file of " + std::to_string(file_bytes) + " bytes");
  for (int i = 24; i < 64; ++i)
    if (header[i] != 0) throw std::runtime_error(where + "shard header padding is not zero (corrupt)");
}

void check_piece_range(const pb::Piece& piece, DType dtype, uint64_t file_bytes,
                       const std::string& where) {
  const uint64_t begin = piece.byte_offset(), length = piece.byte_length();
  if (begin > file_bytes || length > file_bytes - begin)
    throw std::runtime_error(where + "its bytes [" + std::to_string(begin) + ", " +
                             (length <= UINT64_MAX - begin ? std::to_string(begin + length)
                                                           : "+" + std::to_string(length)) +
                             ") end past the end of the file (" +
                             std::to_string(file_bytes) + " bytes): the file is truncated");
  const Shape shape(piece.local_shape().begin(), piece.local_shape().end());
  const int64_t numel = checked_numel(shape, [&](const std::string& e) {
    throw std::runtime_error(where + "piece shape: " + e);
  });
  if (static_cast<uint64_t>(numel) > length || static_cast<uint64_t>(numel) * dtype_size(dtype) != length)
    throw std::runtime_error(where + "piece of shape " + shape_str(shape) + " has " +
                             std::to_string(length) + " bytes");
}

void validate_index(const pb::CheckpointMeta& meta, const std::string& where) {
  for (const pb::TensorInfo& t : meta.tensors()) {
    const std::string at = where + ": tensor " + t.name();
    auto bad = [&](const std::string& what) { throw std::runtime_error(at + ": " + what); };
    const DType dtype = parse_dtype(t.dtype(), at);
    const Shape global(t.global_shape().begin(), t.global_shape().end());
    const int nd = static_cast<int>(global.size());
    const int64_t global_numel = checked_numel(global, bad);
    std::vector<Box> boxes;
    int64_t covered = 0;
    for (const pb::Piece& p : t.pieces()) {
      const Shape local(p.local_shape().begin(), p.local_shape().end());
      const std::string piece = "piece in " + p.file() + " " + shape_str(local) + " at offset " +
                                std::to_string(p.offset()) + " along dim " +
                                std::to_string(p.shard_dim());
      if (p.file().empty() || p.file().find('/') != std::string::npos)
        bad("piece file name '" + p.file() + "' is not a plain file name");
      if (p.shard_dim() < -1 || p.shard_dim() >= nd || static_cast<int>(local.size()) != nd)
        bad(piece + " does not fit the global shape " + shape_str(global));
      for (int d = 0; d < nd; ++d) {
        const bool fits = d == p.shard_dim() ? p.offset() >= 0 && local[d] >= 0 &&
                                                   local[d] <= global[d] - p.offset()
                                             : local[d] == global[d];
        if (!fits) bad(piece + " does not fit the global shape " + shape_str(global));
      }
      if (p.byte_length() != static_cast<uint64_t>(checked_numel(local, bad)) * dtype_size(dtype))
        bad(piece + ": " + std::to_string(p.byte_length()) + " bytes for " + t.dtype());
      const Box box = slab_box(local, p.shard_dim(), p.offset());
      for (const Box& other : boxes)
        if (box_numel(intersect(box, other)) > 0)
          bad(piece +
              " overlaps another piece (two ranks wrote the same slice; mark replicas "
              "writer = false)");
      boxes.push_back(box);
      covered += shape_numel(local);  // disjoint pieces inside global: no overflow
    }
    if (covered != global_numel)
      bad("the pieces hold " + std::to_string(covered) + " of its " +
          std::to_string(shape_numel(global)) + " elements (a slice was not written by any rank)");
  }
}

}  // namespace mod::ckpt
