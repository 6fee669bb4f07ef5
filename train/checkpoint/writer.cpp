// The collective checkpoint save (see writer.h): prepare, write shards, commit on rank 0.
#include "train/checkpoint/writer.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <stdexcept>

#include "core/util/atomic_file.h"
#include "core/util/file_io.h"
#include "train/checkpoint/metadata.h"
#include "train/checkpoint/retention.h"
#include "train/checkpoint/shard_file.h"

namespace mod::ckpt {

namespace fs = std::filesystem;
namespace pb = modtrain::ckpt;

namespace {

constexpr const char* kFaultPointNames[] = {"after_shard", "after_metadata", "after_rename"};
static_assert(std::size(kFaultPointNames) == static_cast<size_t>(FaultPoint::AfterRename),
              "one name per fault point after None");

// Crash tests: the process dies here when the save was asked to.
void fault_point(const SaveOptions& options, FaultPoint point) {
  if (options.fault != point) return;
  std::fprintf(stderr, "modtrain: checkpoint fault point %s: killing this process\n",
               kFaultPointNames[static_cast<int>(point) - 1]);
  std::raise(SIGKILL);
}

// "" or the first problem with an entry this rank writes.
std::string check_entries(const std::vector<TensorEntry>& entries) {
  for (const TensorEntry& e : entries) {
    if (!e.writer) continue;
    const std::string at = "checkpoint: entry '" + e.name + "': ";
    if (e.name.empty()) return "checkpoint: an entry has no name";
    if (!e.local.defined()) return at + "undefined tensor";
    if (e.local.device() != Device::CPU)
      return at + "tensor is on " + device_name(e.local.device());
    const int nd = static_cast<int>(e.global_shape.size());
    if (e.local.dim() != nd || e.shard_dim < -1 || e.shard_dim >= nd)
      return at + "local " + shape_str(e.local.shape()) + " with shard_dim " +
             std::to_string(e.shard_dim) + " does not fit global " + shape_str(e.global_shape);
    for (int d = 0; d < nd; ++d) {
      const int64_t n = e.local.size(d);
      const bool fits = d == e.shard_dim
                            ? e.shard_offset >= 0 && e.shard_offset + n <= e.global_shape[d]
                            : n == e.global_shape[d];
      if (!fits)
        return at + "local " + shape_str(e.local.shape()) + " at offset " +
               std::to_string(e.shard_offset) + " along dim " + std::to_string(e.shard_dim) +
               " does not fit global " + shape_str(e.global_shape);
    }
  }
  return "";
}

// Every rank's string, in rank order: lengths by all_gather, then the bytes padded to the longest.
std::vector<std::string> all_gather_strings(parallel::Communicator& comm, const std::string& s) {
  const int64_t n = comm.size();
  Tensor len = Tensor::from_indices({static_cast<int64_t>(s.size())}, {1}, DType::I64);
  Tensor lens = Tensor::empty({n}, DType::I64);
  comm.all_gather(len, lens);
  int64_t longest = 0;
  for (int64_t r = 0; r < n; ++r) longest = std::max(longest, lens.data<int64_t>()[r]);
  const int64_t words = std::max<int64_t>(1, (longest + 7) / 8);
  Tensor buf = Tensor::zeros({words}, DType::I64);
  std::memcpy(buf.raw_data(), s.data(), s.size());
  Tensor all = Tensor::empty({n * words}, DType::I64);
  comm.all_gather(buf, all);
  std::vector<std::string> out;
  for (int64_t r = 0; r < n; ++r)
    out.emplace_back(all.data<char>() + r * words * 8,
                     static_cast<size_t>(lens.data<int64_t>()[r]));
  return out;
}

std::string broadcast_string(parallel::Communicator& comm, const std::string& s, int root) {
  Tensor len = Tensor::from_indices({static_cast<int64_t>(s.size())}, {1}, DType::I64);
  comm.broadcast(len, root);
  const int64_t n = len.data<int64_t>()[0];
  Tensor buf = Tensor::zeros({std::max<int64_t>(1, (n + 7) / 8)}, DType::I64);
  if (comm.rank() == root) std::memcpy(buf.raw_data(), s.data(), s.size());
  comm.broadcast(buf, root);
  return std::string(buf.data<char>(), static_cast<size_t>(n));
}

// "rank r: message; ..." over the ranks that reported one (the bare message in a world of one).
std::string join_errors(const std::vector<std::string>& errors) {
  std::string out;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    if (!out.empty()) out += "; ";
    out += errors.size() == 1 ? errors[r] : "rank " + std::to_string(r) + ": " + errors[r];
  }
  return out;
}

// A file error names the call and the path; the checkpoint's say they are a checkpoint's.
std::string save_error(const std::exception& e) {
  const bool file = dynamic_cast<const util::FileError*>(&e) != nullptr;
  return (file ? "checkpoint: " : "") + std::string(e.what());
}

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// Rank 0, before a save: leftovers of a crash (step_*.tmp, latest.tmp) go; step_N.tmp is made.
void prepare_directory(const std::string& ckpt_dir, const std::string& tmp_dir) {
  std::error_code ec;
  fs::create_directories(ckpt_dir, ec);
  if (ec)
    throw std::runtime_error("checkpoint: cannot create directory " + ckpt_dir + ": " +
                             ec.message());
  for (const auto& e : fs::directory_iterator(ckpt_dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool leftover = name == "latest.tmp" || (name.rfind("step_", 0) == 0 && name.size() > 4 &&
                                                   name.compare(name.size() - 4, 4, ".tmp") == 0);
    if (!leftover) continue;
    fs::remove_all(e.path(), ec);
    if (ec)
      throw std::runtime_error("checkpoint: cannot remove " + e.path().string() + ": " +
                               ec.message());
  }
  util::make_dir(tmp_dir);
}

}  // namespace

FaultPoint parse_fault_point(const std::string& name) {
  for (int i = 0; i < static_cast<int>(std::size(kFaultPointNames)); ++i)
    if (name == kFaultPointNames[i]) return static_cast<FaultPoint>(i + 1);
  return FaultPoint::None;
}

SaveOptions save_options(const modtrain::CheckpointConfig& cfg) {
  return {cfg.background(), cfg.keep_last(), cfg.keep_every()};
}

struct Checkpointer::Pending {
  TrainState state;
  SaveOptions options;
  std::string tmp_dir, final_dir;
  std::vector<TensorEntry> entries;  // this rank's writer entries (clones when background)
  pb::RankPieces result;             // the pieces written, or error set
  std::thread thread;
};

Checkpointer::Checkpointer(std::string run_dir, parallel::Communicator& comm)
    : run_dir_(std::move(run_dir)), comm_(comm) {}

Checkpointer::~Checkpointer() {
  if (!pending_) return;
  if (pending_->thread.joinable()) pending_->thread.join();
  std::fprintf(stderr,
               "modtrain: checkpoint %s was not committed (Checkpointer::wait() was not called)\n",
               pending_->final_dir.c_str());
}

void Checkpointer::save(const std::vector<TensorEntry>& entries, const TrainState& state,
                        const SaveOptions& options) {
  wait();
  const std::string ckpt_dir = checkpoints_dir(run_dir_);
  auto p = std::make_unique<Pending>();
  p->state = state;
  p->options = options;
  p->final_dir = ckpt_dir + "/" + step_dir_name(state.step);
  p->tmp_dir = p->final_dir + ".tmp";

  // 1. prepare (collective)
  std::string error = check_entries(entries);
  if (error.empty() && state.step < 0)
    error = "checkpoint: step " + std::to_string(state.step) + " is negative";
  if (error.empty() && comm_.rank() == 0) {
    try {
      prepare_directory(ckpt_dir, p->tmp_dir);
    } catch (const std::exception& e) {
      error = save_error(e);
    }
  }
  const std::string errors = join_errors(all_gather_strings(comm_, error));
  if (!errors.empty()) {
    if (comm_.rank() == 0) remove_quietly(p->tmp_dir);
    throw std::runtime_error(errors);
  }

  // 2. this rank's shard file
  for (const TensorEntry& e : entries) {
    if (!e.writer) continue;
    p->entries.push_back(e);
    if (options.background) p->entries.back().local = e.local.clone();
  }
  const std::string path = p->tmp_dir + "/" + shard_file_name(comm_.rank());
  auto write = [job = p.get(), path, rank = comm_.rank()] {
    try {
      if (!job->entries.empty()) job->result = write_shard_file(path, rank, job->entries);
    } catch (const std::exception& e) {
      job->result.Clear();
      job->result.set_error(save_error(e));
    }
    job->entries.clear();  // the clones are no longer needed
    fault_point(job->options, FaultPoint::AfterShard);
  };
  if (options.background) {
    p->thread = std::thread(write);
    pending_ = std::move(p);
    return;
  }
  write();
  pending_ = std::move(p);
  commit();
}

void Checkpointer::wait() {
  if (pending_) commit();
}

void Checkpointer::commit() {
  std::unique_ptr<Pending> p = std::move(pending_);
  if (p->thread.joinable()) p->thread.join();
  const std::vector<std::string> records = all_gather_strings(comm_, p->result.SerializeAsString());
  std::string status;
  if (comm_.rank() == 0) {
    const std::string ckpt_dir = checkpoints_dir(run_dir_);
    try {
      std::vector<pb::RankPieces> ranks(records.size());
      std::vector<std::string> errors(records.size());
      for (size_t r = 0; r < records.size(); ++r)
        if (!ranks[r].ParseFromString(records[r]))
          errors[r] = "checkpoint: unreadable piece records";
        else
          errors[r] = ranks[r].error();
      if (const std::string e = join_errors(errors); !e.empty()) throw std::runtime_error(e);

      pb::CheckpointMeta meta = make_meta(p->state, merge_pieces(ranks));
      validate_index(meta, "checkpoint " + p->tmp_dir);
      util::write_file(p->tmp_dir + "/" + kMetadataFile, seal_meta(meta));
      util::fsync_dir(p->tmp_dir);
      fault_point(p->options, FaultPoint::AfterMetadata);

      if (fs::exists(p->final_dir)) {
        // Replace a complete step_N only now that the new one is complete.
        if (!util::exchange_paths(p->tmp_dir, p->final_dir)) {
          const std::string old = p->final_dir + ".old.tmp";
          util::rename_path(p->final_dir, old);
          util::rename_path(p->tmp_dir, p->final_dir);
          remove_quietly(old);
        }
        util::fsync_dir(ckpt_dir);
        remove_quietly(p->tmp_dir);  // the previous step_N, swapped out
      } else {
        util::rename_path(p->tmp_dir, p->final_dir);
        util::fsync_dir(ckpt_dir);
      }
      fault_point(p->options, FaultPoint::AfterRename);
      util::replace_file(ckpt_dir + "/latest", step_dir_name(p->state.step) + "\n");
    } catch (const std::exception& e) {
      status = save_error(e);
      remove_quietly(p->tmp_dir);
    }
    if (status.empty()) {
      try {
        apply_retention(run_dir_, p->options.keep_last, p->options.keep_every);
      } catch (const std::exception& e) {  // the checkpoint is committed; old ones linger
        std::fprintf(stderr, "modtrain: checkpoint retention: %s\n", e.what());
      }
    }
  }
  status = broadcast_string(comm_, status, 0);
  if (!status.empty()) throw std::runtime_error(status);
  last_committed_ = p->final_dir;
}

}  // namespace mod::ckpt
