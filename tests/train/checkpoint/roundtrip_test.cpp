// Checkpoint round trips on one process: whole tensors of every dtype with the training state,
// tensors saved in pieces along dim 0 and dim 1 read back at other shardings (whole, halves,
// thirds) bitwise, a background save identical to a foreground one byte for byte, replacing an
// existing step, index checks at save time, and retention.
#include <algorithm>
#include <catch2/catch.hpp>

#include "configs/config.h"
#include "tests/train/checkpoint/helpers.h"
#include "train/checkpoint/metadata.h"
#include "train/checkpoint/reader.h"
#include "train/checkpoint/retention.h"
#include "train/checkpoint/writer.h"

using namespace mod;
using namespace mod::test;

namespace {
std::string latest_text(const ScratchDir& run) {
  return file_text(run.path / "checkpoints" / "latest");
}
}  // namespace

TEST_CASE("whole tensors of every dtype and the training state round trip", "[checkpoint]") {
  ScratchDir run("whole");
  auto comm = parallel::make_local_communicator();
  const Tensor f32 = counting({4, 6}), f64 = counting({3}, DType::F64, -2);
  const Tensor i32 = counting({2, 2}, DType::I32, 7), i64 = counting({5}, DType::I64, -3);
  const Tensor bf16 = counting({2, 3}, DType::BF16), scalar = counting({}, DType::F32, 42);
  ckpt::Checkpointer writer(run.str(), *comm);
  writer.save({whole("model/a", f32), whole("model/b", f64), whole("optim/c", i32),
               whole("optim/d", i64), whole("model/e", bf16), whole("model/scalar", scalar)},
              state_at(7));
  REQUIRE(writer.last_committed() == run.str() + "/checkpoints/step_00000007");
  CHECK(latest_text(run) == "step_00000007\n");
  const std::string shard = file_text(run.path / "checkpoints/step_00000007/shard_0.bin");
  CHECK(shard.substr(0, 8) == "MODSHARD");
  // Six blobs, each at a 64-byte boundary after a 64-byte header.
  CHECK(shard.size() == 64 + 128 + 64 + 64 + 64 + 64 + 4);

  REQUIRE(ckpt::find_latest(run.str()) == run.str() + "/checkpoints/step_00000007");
  ckpt::CheckpointReader r(*ckpt::find_latest(run.str()));
  CHECK(r.tensor_names() == std::vector<std::string>{"model/a", "model/b", "model/e",
                                                     "model/scalar", "optim/c", "optim/d"});
  CHECK(bitwise_equal(r.read_full("model/a"), f32));
  CHECK(bitwise_equal(r.read_full("model/b"), f64));
  CHECK(bitwise_equal(r.read_full("optim/c"), i32));
  CHECK(bitwise_equal(r.read_full("optim/d"), i64));
  CHECK(bitwise_equal(r.read_full("model/e"), bf16));
  CHECK(bitwise_equal(r.read_full("model/scalar"), scalar));
  CHECK(r.read("model/b", {3}, -1, 0, DType::F32).to_vector() ==
        std::vector<double>{-2, -1.875, -1.75});

  const ckpt::TrainState s = r.state();
  CHECK(s.step == 7);
  CHECK(s.tokens_seen == 7 * 1024);
  CHECK(s.loader_seed == 1337);
  CHECK(s.batches_drawn == 14);
  CHECK(s.rng_state == std::vector<uint64_t>{1, 2, 3, 7});
  CHECK(s.elapsed_seconds == 10.5);
  CHECK(s.last_metrics_step == 7);
  CHECK(s.optimizer_steps == 7);
  CHECK(s.mesh.world_size == 1);
  CHECK(s.config.name() == "ckpt_test");
  CHECK(s.config.model().d_model() == 32);
}

TEST_CASE("tensors saved in pieces read back at any sharding, bitwise", "[checkpoint]") {
  ScratchDir run("reshard");
  auto comm = parallel::make_local_communicator();
  const Tensor a = counting({6, 12}), b = counting({6, 12}, DType::F32, 100);
  const Tensor c = counting({12, 6, 2}, DType::F64, -50);
  // a in two row pieces, b in two column pieces, c in three uneven pieces along dim 1... of 6.
  std::vector<ckpt::TensorEntry> entries = {piece("a", a, 0, 1, 2), piece("a", a, 0, 0, 2),
                                            piece("b", b, 1, 0, 2), piece("b", b, 1, 1, 2)};
  entries.push_back({"c", slice(c, 1, 0, 1), c.shape(), 1, 0, true});
  entries.push_back({"c", slice(c, 1, 1, 4), c.shape(), 1, 1, true});
  entries.push_back({"c", slice(c, 1, 5, 1), c.shape(), 1, 5, true});
  entries.push_back({"a", counting({1}), {1}, -1, 0, false});  // a replica: not written
  ckpt::Checkpointer(run.str(), *comm).save(entries, state_at(3));
  ckpt::CheckpointReader r(run.str() + "/checkpoints/step_00000003");

  for (const auto& [name, full] :
       std::vector<std::pair<std::string, Tensor>>{{"a", a}, {"b", b}, {"c", c}}) {
    INFO("tensor " << name);
    CHECK(bitwise_equal(r.read(name, full.shape(), -1, 0, full.dtype()), full));
    for (int dim = 0; dim < full.dim(); ++dim)
      for (int n : {2, 3}) {
        if (full.size(dim) % n != 0) continue;
        const int64_t len = full.size(dim) / n;
        for (int k = 0; k < n; ++k) {
          INFO("dim " << dim << ", piece " << k << " of " << n);
          Shape shape = full.shape();
          shape[dim] = len;
          CHECK(bitwise_equal(r.read(name, shape, dim, k * len, full.dtype()),
                              slice(full, dim, k * len, len)));
        }
      }
  }
  // f64 pieces read as f32 convert element by element.
  const Tensor c32 = r.read("c", {12, 6, 2}, -1, 0, DType::F32);
  CHECK(c32.to_vector() == c.to(DType::F32).to_vector());
}

TEST_CASE("a background save equals a foreground save byte for byte", "[checkpoint]") {
  ScratchDir fg("fg"), bg("bg");
  auto comm = parallel::make_local_communicator();
  const Tensor a = counting({64, 32}), b = counting({3, 5}, DType::F64, 9);
  auto entries = [&](const Tensor& live) {
    return std::vector<ckpt::TensorEntry>{whole("model/live", live), piece("model/a", a, 1, 0, 2),
                                          piece("model/a", a, 1, 1, 2), whole("optim/m/b", b)};
  };
  ckpt::Checkpointer(fg.str(), *comm).save(entries(a), state_at(5));

  Tensor live = a.clone();
  ckpt::Checkpointer writer(bg.str(), *comm);
  writer.save(entries(live), state_at(5), {.background = true});
  CHECK(writer.pending());
  live.set(0, -1.0);  // training goes on: the save holds its own copy
  CHECK_FALSE(fs::exists(bg.path / "checkpoints/latest"));  // committed only by wait()
  writer.wait();
  CHECK_FALSE(writer.pending());
  const fs::path f = fg.path / "checkpoints/step_00000005",
                 g = bg.path / "checkpoints/step_00000005";
  CHECK(file_text(g / "shard_0.bin").size() > 16384);
  CHECK(file_text(g / "shard_0.bin") == file_text(f / "shard_0.bin"));
  CHECK(file_text(g / "metadata.pb") == file_text(f / "metadata.pb"));
  CHECK(file_text(bg.path / "checkpoints/latest") == file_text(fg.path / "checkpoints/latest"));
  CHECK(bitwise_equal(ckpt::CheckpointReader(g.string()).read_full("model/live"), a));
}

TEST_CASE("saving a step again replaces it only once the new one is complete", "[checkpoint]") {
  ScratchDir run("replace");
  auto comm = parallel::make_local_communicator();
  ckpt::Checkpointer writer(run.str(), *comm);
  writer.save({whole("w", counting({4}, DType::F32, 1))}, state_at(5));
  writer.save({whole("w", counting({4}, DType::F32, 2))}, state_at(5));
  CHECK(
      ckpt::CheckpointReader(run.str() + "/checkpoints/step_00000005").read_full("w").to_vector() ==
      std::vector<double>{2, 2.125, 2.25, 2.375});
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(run.path / "checkpoints"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step_00000005"});
}

TEST_CASE("a save whose pieces overlap or leave a gap is refused before anything commits",
          "[checkpoint]") {
  ScratchDir run("badindex");
  auto comm = parallel::make_local_communicator();
  const Tensor a = counting({4, 4});
  ckpt::Checkpointer writer(run.str(), *comm);
  writer.save({whole("a", a)}, state_at(1));
  CHECK_THROWS_WITH(writer.save({piece("a", a, 0, 0, 2), piece("a", a, 0, 0, 2)}, state_at(2)),
                    Catch::Contains("tensor a") && Catch::Contains("overlaps another piece"));
  CHECK_THROWS_WITH(writer.save({piece("a", a, 0, 1, 2)}, state_at(2)),
                    Catch::Contains("tensor a") && Catch::Contains("hold 8 of its 16 elements"));
  CHECK_THROWS_WITH(writer.save({{"a", counting({3, 4}), {4, 4}, 0, 2, true}}, state_at(2)),
                    Catch::Contains("entry 'a'") && Catch::Contains("does not fit global [4, 4]"));
  CHECK(latest_text(run) == "step_00000001\n");
  CHECK_FALSE(fs::exists(run.path / "checkpoints/step_00000002"));
  CHECK_FALSE(fs::exists(run.path / "checkpoints/step_00000002.tmp"));
}

TEST_CASE("retention keeps the newest, the milestones and what latest names", "[checkpoint]") {
  using V = std::vector<int64_t>;
  CHECK(ckpt::steps_to_delete({1, 2, 3, 4, 5}, 2, 0, 5) == V{1, 2, 3});
  CHECK(ckpt::steps_to_delete({1, 2, 3, 4, 5}, 0, 2, 5) == V{});  // keep_last 0 keeps all
  CHECK(ckpt::steps_to_delete({5, 1, 4, 2, 3}, 1, 2, 5) == V{1, 3});
  CHECK(ckpt::steps_to_delete({1, 2, 3, 9}, 1, 0, 2) == V{1, 3});  // latest (2) is kept

  ScratchDir run("retention");
  auto comm = parallel::make_local_communicator();
  ckpt::Checkpointer writer(run.str(), *comm);
  const ckpt::SaveOptions keep{.keep_last = 2, .keep_every = 4};
  for (int64_t step = 1; step <= 9; ++step)
    writer.save({whole("w", counting({2}, DType::F32, static_cast<double>(step)))}, state_at(step),
                keep);
  auto steps = [&] {
    V out;
    for (const auto& [s, _] : ckpt::list_checkpoints(run.str())) out.push_back(s);
    return out;
  };
  CHECK(steps() == V{4, 8, 9});
  // Back at step 3 (a resume from an older checkpoint): latest is never deleted.
  writer.save({whole("w", counting({2}))}, state_at(3), {.keep_last = 1, .keep_every = 4});
  CHECK(steps() == V{3, 4, 8, 9});
  CHECK(latest_text(run) == "step_00000003\n");
  writer.save({whole("w", counting({2}))}, state_at(10), {.keep_last = 1});
  CHECK(steps() == V{10});
}

TEST_CASE("CheckpointConfig maps to save options and is validated by field", "[checkpoint]") {
  modtrain::RunConfig run;
  modtrain::CheckpointConfig& cfg = *run.mutable_checkpoint();
  CHECK(cfg.keep_last() == 3);
  cfg.set_keep_every(1000);
  cfg.set_background(true);
  const ckpt::SaveOptions o = ckpt::save_options(cfg);
  CHECK(o.keep_last == 3);
  CHECK(o.keep_every == 1000);
  CHECK(o.background);
  CHECK_NOTHROW(config::validate(run));
  config::apply_override(run, "checkpoint.every_minutes=-1");
  CHECK_THROWS_WITH(config::validate(run),
                    "config: checkpoint.every_minutes: -1 must be >= 0, in [0, 1e+06]");
  config::apply_override(run, "checkpoint.every_minutes=30");
  config::apply_override(run, "checkpoint.keep_last=-2");
  CHECK_THROWS_WITH(config::validate(run),
                    "config: checkpoint.keep_last: -2 must be >= 0 (0 keeps all)");
  config::apply_override(run, "checkpoint.keep_last=0");
  config::apply_override(run, "checkpoint.every_steps=-5");
  CHECK_THROWS_WITH(config::validate(run),
                    "config: checkpoint.every_steps: -5 must be >= 0 (0: off)");
  config::apply_override(run, "checkpoint.every_steps=100");
  config::apply_override(run, "checkpoint.keep_every=-1");
  CHECK_THROWS_WITH(config::validate(run), Catch::Contains("checkpoint.keep_every"));
}

// The mesh records parallel.zero_stage; files older than the field hold only the boolean zero1,
// read as stage 1 (true) or 0.
TEST_CASE("the saved mesh's ZeRO stage round trips, and older files' zero1 reads as stage 1",
          "[checkpoint]") {
  ckpt::TrainState s = state_at(3);
  s.mesh = {2, 1, 2, 2};
  modtrain::ckpt::CheckpointMeta meta = ckpt::make_meta(s, {});
  CHECK(meta.mesh().zero1());  // readers that know only zero1 see the optimizer state sharded
  CHECK(ckpt::state_from_meta(meta).mesh.zero_stage == 2);
  meta.mutable_mesh()->clear_zero_stage();
  CHECK(ckpt::state_from_meta(meta).mesh.zero_stage == 1);
  meta.mutable_mesh()->set_zero1(false);
  CHECK(ckpt::state_from_meta(meta).mesh.zero_stage == 0);
}

// A config naming both parallel.zero1 and parallel.zero_stage is refused, but builds before that
// saved one where they agreed: its checkpoint opens, read as zero_stage alone.
TEST_CASE("an older checkpoint's config naming zero1 and an agreeing zero_stage still opens",
          "[checkpoint]") {
  ckpt::TrainState s = state_at(3);
  auto* p = s.config.mutable_parallel();
  p->set_dp(2);
  p->set_zero1(true);
  p->set_zero_stage(1);
  modtrain::ckpt::CheckpointMeta meta = ckpt::make_meta(s, {});
  const modtrain::ckpt::CheckpointMeta opened = ckpt::open_meta(ckpt::seal_meta(meta), "old");
  CHECK_FALSE(opened.config().parallel().has_zero1());
  CHECK(config::zero_stage(opened.config().parallel()) == 1);
}
