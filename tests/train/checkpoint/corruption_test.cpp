// Damaged checkpoints: a flipped byte, a truncated shard, a missing shard, unreadable metadata,
// and a checkpoint of another model. Each error names the file and the tensor (or the config
// field), reading never writes, and the tensors not touched by the damage still read back.
#include <catch2/catch.hpp>
#include <fstream>
#include <functional>

#include "tests/train/checkpoint/helpers.h"
#include "train/checkpoint/reader.h"
#include "train/checkpoint/writer.h"
#include "tests/support/errors.h"

using namespace mod;
using namespace mod::test;

namespace {

const Tensor kFirst = counting({8, 8}), kLast = counting({16, 4}, DType::F32, 5);

// A checkpoint whose shard_0.bin ends with model/last's bytes; returns its directory.
std::string save_two(const ScratchDir& run) {
  auto comm = parallel::make_local_communicator();
  ckpt::Checkpointer(run.str(), *comm)
      .save({whole("model/first", kFirst), whole("model/last", kLast)}, ckpt::TrainState{});
  return run.str() + "/checkpoints/step_00000000";
}


}  // namespace

TEST_CASE("a flipped byte in a shard is a CRC32C mismatch naming file and tensor", "[checkpoint]") {
  ScratchDir run("flip");
  const std::string dir = save_two(run), shard = dir + "/shard_0.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    const char c = static_cast<char>(f.peek() ^ 0x10);
    f.seekp(-3, std::ios::end);
    f.put(c);
  }
  const std::string before = file_text(shard);
  ckpt::CheckpointReader r(dir);
  const std::string e = error_of([&] { r.read_full("model/last"); });
  CHECK_THAT(e, Catch::StartsWith("checkpoint " + shard +
                                  ": tensor model/last: CRC32C mismatch (stored 0x"));
  CHECK_THAT(e, Catch::Contains(", computed 0x"));
  CHECK(bitwise_equal(r.read_full("model/first"), kFirst));
  CHECK(file_text(shard) == before);  // nothing was rewritten
}

TEST_CASE("a truncated shard names file and tensor", "[checkpoint]") {
  ScratchDir run("trunc");
  const std::string dir = save_two(run), shard = dir + "/shard_0.bin";
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 10);
  ckpt::CheckpointReader r(dir);
  CHECK(error_of([&] { r.read_full("model/last"); }) ==
        "checkpoint " + shard + ": tensor model/last: its bytes [" + std::to_string(size - 256) +
            ", " + std::to_string(size) + ") end past the end of the file (" +
            std::to_string(size - 10) + " bytes): the file is truncated");
  CHECK(bitwise_equal(r.read_full("model/first"), kFirst));
  CHECK(fs::file_size(shard) == size - 10);
}

TEST_CASE("a missing shard names file and tensor", "[checkpoint]") {
  ScratchDir run("missing");
  const std::string dir = save_two(run), shard = dir + "/shard_0.bin";
  fs::remove(shard);
  ckpt::CheckpointReader r(dir);  // metadata alone is fine until a tensor is read
  CHECK(error_of([&] { r.read_full("model/first"); }) ==
        "checkpoint " + shard +
            ": tensor model/first: cannot open the shard file: No such file or directory");
}

TEST_CASE("unknown tensors, wrong shapes and wrong dtypes name the metadata and the tensor",
          "[checkpoint]") {
  ScratchDir run("requests");
  const std::string dir = save_two(run), meta = dir + "/metadata.pb";
  ckpt::CheckpointReader r(dir);
  CHECK(error_of([&] { r.read_full("model/nope"); }) ==
        "checkpoint " + meta + ": tensor model/nope: unknown (not in this checkpoint)");
  CHECK(error_of([&] {
          r.read("model/first", {8, 9});
        }) ==
        "checkpoint " + meta +
            ": tensor model/first: requested [8, 9] whole does not fit its saved shape [8, 8]");
  CHECK(error_of([&] {
          r.read("model/first", {8, 4}, 1, 6);
        }) ==
        "checkpoint " + meta +
            ": tensor model/first: requested [8, 4] at offset 6 along dim 1 does not fit its saved "
            "shape [8, 8]");
  CHECK(error_of([&] {
          r.read("model/first", {8, 8}, -1, 0, DType::I32);
        }) == "checkpoint " + meta + ": tensor model/first: saved as f32, requested as i32");
}

TEST_CASE("unreadable metadata is an error naming metadata.pb, also through latest",
          "[checkpoint]") {
  ScratchDir run("badmeta");
  const std::string dir = save_two(run), meta = dir + "/metadata.pb";
  {
    std::ofstream out(meta, std::ios::binary | std::ios::trunc);
    out << "\xff\xff\xff garbage";
  }
  CHECK(error_of([&] { ckpt::CheckpointReader r(dir); }) ==
        "checkpoint " + meta + ": cannot parse as CheckpointMeta");
  CHECK_THAT(error_of([&] { ckpt::find_latest(run.str()); }),
             Catch::Contains(meta + ": cannot parse") && Catch::Contains("latest"));
  fs::remove(meta);
  CHECK_THAT(error_of([&] { ckpt::find_latest(run.str()); }),
             Catch::Contains("names " + dir + ", which has no metadata.pb"));
  CHECK_THAT(error_of([&] { ckpt::resolve_checkpoint(run.str() + "/nowhere"); }),
             Catch::Contains("nowhere: neither a checkpoint directory"));
  ScratchDir empty("empty");
  CHECK(ckpt::find_latest(empty.str()) == std::nullopt);
}

TEST_CASE("a checkpoint of another model is refused naming the field and the tensor",
          "[checkpoint]") {
  ScratchDir run("othermodel");
  auto comm = parallel::make_local_communicator();
  ckpt::TrainState state;
  state.config.mutable_model()->set_d_model(16);
  state.config.mutable_model()->mutable_mod()->add_routed_blocks(1);
  ckpt::Checkpointer(run.str(), *comm).save({whole("model/wte.weight", counting({32, 16}))}, state);
  const std::string dir = *ckpt::find_latest(run.str()), meta = dir + "/metadata.pb";
  ckpt::CheckpointReader r(dir);

  modtrain::RunConfig same = state.config;
  same.mutable_optimizer()->set_lr(0.5);      // not part of the model: may change on resume
  same.mutable_model()->set_vocab_size(256);  // the default, now explicit
  CHECK_NOTHROW(r.check_compatible(same));

  modtrain::RunConfig wider = state.config;
  wider.mutable_model()->set_d_model(32);
  CHECK(error_of([&] { r.check_compatible(wider); }) ==
        "checkpoint " + meta +
            ": the model differs from the run's: model.d_model: 16 in the checkpoint, 32 now");
  modtrain::RunConfig routed = state.config;
  routed.mutable_model()->mutable_mod()->add_routed_blocks(3);
  CHECK(error_of([&] { r.check_compatible(routed); }) ==
        "checkpoint " + meta +
            ": the model differs from the run's: model.mod.routed_blocks: 1 values in the "
            "checkpoint, 2 now");
  modtrain::RunConfig gate = state.config;
  gate.mutable_model()->mutable_mod()->mutable_router()->set_gate(modtrain::RouterConfig::SIGMOID);
  CHECK_THAT(error_of([&] { r.check_compatible(gate); }),
             Catch::EndsWith("model.mod.router.gate: IDENTITY in the checkpoint, SIGMOID now"));
  // Reading with the other model's shape names the tensor.
  CHECK_THAT(error_of([&] {
               r.read("model/wte.weight", {32, 32});
             }),
             Catch::Contains(meta + ": tensor model/wte.weight: requested [32, 32]") &&
                 Catch::Contains("saved shape [32, 16]"));
}
