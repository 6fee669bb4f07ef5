// Issue 43's size and layout findings, one test each: safetensors whose tensors do not tile the
// data section, weights headers with long runs of spaces or digits, and weights or checkpoints
// whose embedded config describes a model the file does not hold (refused before it is built).
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <functional>

#include "configs/config.h"
#include "core/util/safetensors.h"
#include "grid/expand.h"
#include "grid/spec.h"
#include "tests/train/checkpoint/helpers.h"
#include "train/checkpoint/writer.h"
#include "train/weights.h"
#include "tests/support/errors.h"

using namespace mod;
using namespace mod::test;
using Catch::Contains;

namespace {
uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);  // little-endian, as the hosts that run this
  return n;
}
// The file with its header replaced (the data section kept as it is).
std::string with_header(const std::string& file, const std::string& header) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + file.substr(8 + header_length(file));
}
std::string header_of(const std::string& file) { return file.substr(8, header_length(file)); }
std::string make_file(const std::string& header, const std::string& data) {
  return with_header(std::string(8, '\0'), header) + data;
}

// A small valid config and its model's weights file at step 7.
modtrain::RunConfig tiny_config() {
  return config::parse_checked(
      "model { vocab_size: 32 d_model: 16 n_layers: 2 n_heads: 2 d_ff: 32 seq_len: 8 "
      "mod { enabled: true } }",
      "tiny");
}
void save_tiny(const std::string& path, const modtrain::RunConfig& cfg) {
  const model::Transformer m(tiny_config().model(), 1);
  train::save_weights(path, m, cfg, 7);
}
}  // namespace

TEST_CASE("safetensors tensors must tile the data section exactly, as the reference library says",
          "[inputs]") {
  ScratchDir dir("tiling");
  const std::string path = dir.str() + "/t.safetensors";
  save_safetensors(path, {{"a", counting({2, 2})}, {"b", counting({3})}});
  const std::string good = file_text(path);
  const std::string h = header_of(good);
  CHECK(load_safetensors(path).tensors.size() == 2);
  // Header length one short: the last header byte (padding here) becomes the first data byte.
  const std::string padded = with_header(good, h + "    ");
  write_bytes(path, padded);
  CHECK(load_safetensors(path).tensors.size() == 2);
  std::string short_len = padded;
  const uint64_t n = header_length(padded) - 1;
  std::memcpy(short_len.data(), &n, 8);
  write_bytes(path, short_len);
  CHECK_THAT(error_of([&] { load_safetensors(path); }), Contains(path) && Contains("not fully covered"));
  // Bytes inserted between the header and the data, or appended.
  write_bytes(path, good.substr(0, 8 + h.size()) + "abcd" + good.substr(8 + h.size()));
  CHECK_THAT(error_of([&] { load_safetensors(path); }),
             Contains(path) && Contains("tensor 'b'") && Contains("not fully covered"));
  write_bytes(path, good + "x");
  CHECK_THAT(error_of([&] { load_safetensors(path); }), Contains("28 of the 29 data bytes"));
  // A gap or an overlap between tensors names the tensor after it.
  const std::string f32 = R"("dtype":"F32","shape":[1],"data_offsets":)";
  const std::string data8(8, '\0');
  write_bytes(path, make_file("{\"a\":{" + f32 + "[0,4]},\"b\":{" + f32 + "[8,12]}}", data8 + "pad!"));
  CHECK_THAT(error_of([&] { load_safetensors(path); }), Contains("tensor 'b'") && Contains("a gap"));
  write_bytes(path, make_file("{\"a\":{" + f32 + "[0,4]},\"b\":{" + f32 + "[0,4]}}", data8.substr(4)));
  CHECK_THAT(error_of([&] { load_safetensors(path); }), Contains("an overlap"));
  // Header order need not be offset order (the reference library sorts too).
  write_bytes(path, make_file("{\"b\":{" + f32 + "[4,8]},\"a\":{" + f32 + "[0,4]}}", data8));
  CHECK(load_safetensors(path).tensors.size() == 2);
}

TEST_CASE("a weights header with long runs of spaces or digits gives its step or a clear error",
          "[inputs]") {
  ScratchDir run("longruns");
  const std::string weights = run.str() + "/model.safetensors";
  save_tiny(weights, tiny_config());
  const std::string good = file_text(weights);
  const std::string h = header_of(good);
  const size_t step_at = h.find("\"step\"") + 6;
  REQUIRE(step_at > 6);
  // std::regex recursed once per character here: 40,000 overflowed the stack.
  write_bytes(weights, with_header(good, h.substr(0, step_at) + std::string(100000, ' ') + h.substr(step_at)));
  CHECK(train::weights_step(weights) == 7);
  // A run directory with a checkpoint compares the two steps: the weights file is newer.
  auto comm = parallel::make_local_communicator();
  ckpt::Checkpointer(run.str(), *comm).save({whole("model/w", counting({2}))}, state_at(3));
  CHECK(train::load_model(run.str()).step == 7);
  const std::string digits(100000, '1');
  write_bytes(weights, with_header(good, h.substr(0, h.find("\"7\"")) + "\"" + digits + "\"" +
                                             h.substr(h.find("\"7\"") + 3)));
  CHECK(train::weights_step(weights) == -1);
  CHECK_THAT(error_of([&] { train::load_weights(weights); }),
             Contains(weights) && Contains("is not a step number") && Contains("(100000 bytes)"));
}

TEST_CASE("weights and checkpoints that lack their config's tensors are refused before building",
          "[inputs]") {
  ScratchDir run("nobuild");
  const std::string weights = run.str() + "/model.safetensors";
  // The embedded config says 1024 blocks of width 4096 (about 200 billion parameters, 800 GB);
  // the file holds 2 blocks of width 16. Building the model first would never finish.
  modtrain::RunConfig big = tiny_config();
  big.mutable_model()->set_n_layers(1024);
  big.mutable_model()->set_d_model(4096);
  big.mutable_model()->set_n_heads(32);
  big.mutable_model()->set_d_ff(16384);
  save_tiny(weights, big);
  CHECK_THAT(error_of([&] { train::load_weights(weights); }),
             Contains(weights) && Contains("tensor embed.weight has shape [32, 16]") &&
                 Contains("[32, 4096]"));
  // The same width, more blocks than the file holds; and one tensor too many.
  big = tiny_config();
  big.mutable_model()->set_n_layers(1000);
  save_tiny(weights, big);
  CHECK_THAT(error_of([&] { train::load_weights(weights); }), Contains("missing tensor blocks.2."));
  const model::Transformer m(tiny_config().model(), 1);
  auto params = m.named_parameters();
  params.push_back({"extra", counting({1})});
  train::save_weights(weights, params, tiny_config(), 7);
  const std::string n = std::to_string(params.size() - 1);
  CHECK_THAT(error_of([&] { train::load_weights(weights); }),
             Contains(std::to_string(params.size()) + " tensors, the model has " + n));
  // A checkpoint whose config says 1000 blocks but holds none of them.
  std::filesystem::remove(weights);
  auto comm = parallel::make_local_communicator();
  ckpt::TrainState state = state_at(3);
  state.config = big;
  std::vector<ckpt::TensorEntry> entries;
  for (const auto& [name, t] : m.named_parameters()) entries.push_back(whole("model/" + name, t));
  ckpt::Checkpointer(run.str(), *comm).save(entries, state);
  CHECK_THAT(error_of([&] { train::load_model(run.str()); }),
             Contains("metadata.pb") && Contains("missing tensor model/blocks.2."));
}

TEST_CASE("model sizes of 2^31 are refused from every config source", "[inputs]") {
  // A weights file's embedded config: refused by validation, before its tensors are looked at.
  ScratchDir run("sizes");
  const std::string weights = run.str() + "/w.safetensors";
  for (const char* field : {"n_layers", "seq_len"}) {
    INFO(field);
    save_safetensors(weights, {}, {{"format", "modtrain-weights-1"}, {"step", "1"},
                                   {"config", std::string("model { ") + field + ": 2147483647 }"}});
    CHECK_THAT(error_of([&] { train::load_weights(weights); }),
               Contains(weights) && Contains(std::string("model.") + field) && Contains("at most"));
  }
  // A grid point whose shape is too deep: skipped with the reason, and the spec names the shape.
  const std::string spec_text =
      "name: \"g\" budgets: [1e12] variants { name: \"d\" }\n"
      "shapes { name: \"s\" d_model: 64 n_layers: 100000 n_heads: 2 d_ff: 128 }\n";
  const modtrain::GridSpec spec = grid::parse_grid_text(spec_text, "g.textproto");
  CHECK_THAT(error_of([&] { grid::validate_grid(spec, "g.textproto"); }),
             Contains("shapes[0].n_layers") && Contains("at most 1024"));
  for (const auto& p : grid::expand(spec)) CHECK_THAT(p.skip_reason, Contains("model.n_layers"));
  const std::string wide =
      "name: \"g\" budgets: [1e12] variants { name: \"d\" }\n"
      "shapes { name: \"s\" d_model: 65536 n_layers: 1024 n_heads: 2 d_ff: 262144 }\n";
  CHECK_THAT(error_of([&] { grid::validate_grid(grid::parse_grid_text(wide, "g"), "g"); }),
             Contains("shapes[0]: model: up to") && Contains("parameters exceed"));
}

TEST_CASE("the safetensors fuzz seeds include whole models that pass every header check",
          "[inputs]") {
  // So the fuzzer starts past the checks, where a mutation can reach the weights_step agreement.
  for (const char* seed : {"tiny_model.safetensors", "long_runs.safetensors"}) {
    INFO(seed);
    const std::string path = std::string(MOD_SOURCE_DIR) + "/tests/fuzz/corpus/safetensors/" + seed;
    CHECK(train::check_weights_header(read_safetensors_index(path), path).step == 3);
    CHECK(train::weights_step(path) == 3);
  }
}
