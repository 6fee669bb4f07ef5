// The inputs the fuzzing issue found accepted that should not be, one test each: a flipped
// checkpoint step, an invalid config inside a weights file, NaN/inf/zero-divisor config values,
// a malformed merge line, a corrupted TensorBoard file on resume, and unchecked header fields.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <functional>

#include "configs/config.h"
#include "core/util/safetensors.h"
#include "core/util/safetensors_header.h"
#include "tests/train/checkpoint/helpers.h"
#include "train/checkpoint/checkpoint.pb.h"
#include "train/checkpoint/metadata.h"
#include "train/checkpoint/reader.h"
#include "train/checkpoint/writer.h"
#include "train/data/token_file.h"
#include "train/data/tokenizer.h"
#include "train/metrics/metrics_writer.h"
#include "train/weights.h"
#include "tests/support/errors.h"

using namespace mod;
using namespace mod::test;
using Catch::Contains;

namespace {
std::string config_error(const std::string& text) {
  return error_of([&] { config::validate(config::parse_text(text, "t.textproto")); });
}
}  // namespace

TEST_CASE("a checkpoint whose step or optimizer_steps changed is refused by its checksum", "[inputs]") {
  ScratchDir run("metacrc");
  auto comm = parallel::make_local_communicator();
  ckpt::Checkpointer(run.str(), *comm).save({whole("model/w", counting({4, 4}))}, state_at(10));
  const std::string dir = run.str() + "/checkpoints/step_00000010", path = dir + "/metadata.pb";
  const std::string good = file_text(path);
  CHECK(ckpt::CheckpointReader(dir).state().step == 10);
  for (auto change : std::vector<std::function<void(modtrain::ckpt::CheckpointMeta&)>>{
           [](auto& m) { m.set_step(11); }, [](auto& m) { m.set_optimizer_steps(3); },
           [](auto& m) { m.mutable_config()->mutable_optimizer()->set_lr(0.5); }}) {
    modtrain::ckpt::CheckpointMeta meta;
    REQUIRE(meta.ParseFromString(good));
    change(meta);  // the stored checksum stays that of the original
    write_bytes(path, meta.SerializeAsString());
    CHECK_THAT(error_of([&] { ckpt::CheckpointReader r(dir); }),
               Contains(path) && Contains("checksum mismatch"));
  }
  // Checkpoints written before the checksum (none stored) still resume.
  modtrain::ckpt::CheckpointMeta old;
  REQUIRE(old.ParseFromString(good));
  old.clear_meta_crc32c();
  write_bytes(path, old.SerializeAsString());
  CHECK(ckpt::CheckpointReader(dir).state().step == 10);
}

TEST_CASE("a checkpoint shard header with a wrong version or padding is refused", "[inputs]") {
  unsigned char h[64] = {'M', 'O', 'D', 'S', 'H', 'A', 'R', 'D', 1};
  CHECK_NOTHROW(ckpt::check_shard_header(h, 128, "s: "));
  h[8] = 2;
  CHECK_THAT(error_of([&] { ckpt::check_shard_header(h, 128, "s: "); }), Contains("version 2"));
  h[8] = 1;
  h[40] = 7;
  CHECK_THAT(error_of([&] { ckpt::check_shard_header(h, 128, "s: "); }), Contains("padding"));
  h[40] = 0;
  h[23] = 0x10;  // 2^60 pieces
  CHECK_THAT(error_of([&] { ckpt::check_shard_header(h, 128, "s: "); }), Contains("pieces"));
  modtrain::ckpt::Piece p;
  p.add_local_shape(int64_t{1} << 40);
  p.add_local_shape(int64_t{1} << 40);
  p.set_byte_length(16);
  CHECK_THAT(error_of([&] { ckpt::check_piece_range(p, DType::F32, 128, "s: "); }),
             Contains("2^63") || Contains("bytes"));
}

TEST_CASE("the config inside a weights file is validated like a config file", "[inputs]") {
  ScratchDir dir("weightscfg");
  const std::string path = dir.str() + "/bad.safetensors";
  save_safetensors(path, {}, {{"format", "modtrain-weights-1"}, {"step", "3"},
                              {"config", "model { n_heads: 3 }"}});
  CHECK_THAT(error_of([&] { train::load_weights(path); }), Contains(path) && Contains("model.n_heads"));
  save_safetensors(path, {}, {{"format", "modtrain-weights-1"}, {"step", "3"},
                              {"config", "optimizer { lr: nan }"}});
  CHECK_THAT(error_of([&] { train::load_weights(path); }), Contains(path) && Contains("optimizer.lr"));
  save_safetensors(path, {}, {{"format", "modtrain-weights-1"}, {"step", "x3"}, {"config", ""}});
  CHECK_THAT(error_of([&] { train::load_weights(path); }), Contains("metadata step 'x3'"));
}

TEST_CASE("NaN, infinite and zero-divisor config values are refused naming the field", "[inputs]") {
  CHECK(config_error("") == "no error");
  CHECK_THAT(config_error("optimizer { lr: nan }"), Contains("optimizer.lr"));
  CHECK_THAT(config_error("optimizer { grad_clip: inf }"), Contains("optimizer.grad_clip"));
  CHECK_THAT(config_error("optimizer { min_lr: -inf }"), Contains("optimizer.min_lr"));
  CHECK_THAT(config_error("model { mod { capacity: nan } }"), Contains("model.mod.capacity"));
  CHECK_THAT(config_error("model { mod { block_capacity: [0.5, inf] } }"),
             Contains("model.mod.block_capacity[1]"));
  CHECK_THAT(config_error("parallel { bucket_mb: nan }"), Contains("parallel.bucket_mb"));
  CHECK_THAT(config_error("parallel { bucket_mb: 0 }"), Contains("parallel.bucket_mb"));
  CHECK_THAT(config_error("train { log_every: 0 }"), Contains("train.log_every"));
  CHECK_THAT(config_error("train { eval_batches: 0 }"), Contains("train.eval_batches"));
  CHECK_THAT(config_error("optimizer { eps: 0 }"), Contains("optimizer.eps"));
  CHECK_THAT(config_error("model { norm_eps: 0 }"), Contains("model.norm_eps"));
  CHECK_THAT(config_error("parallel { dp: 65536 tp: 65536 } train { cuda_graph: true device: CUDA }"),
             Contains("parallel.dp"));  // a fuzzed case that once overflowed dp * tp
}

TEST_CASE("a malformed tokenizer line is refused naming the file and the line", "[inputs]") {
  const std::string head = "modtrain-tokenizer 1\nkind bpe\nvocab_size 258\nmerges 2\n";
  CHECK(data::Tokenizer::parse_text(head + "104 101\n256 108\n", "t")->vocab_size() == 258);
  for (const auto& [body, line] : std::vector<std::pair<std::string, std::string>>{
           {"104 101\n256 108 7\n", "line 6"},  // a third number used to start the next merge
           {"104 101 256 108\n", "line 5"},
           {"104 -1\n256 108\n", "line 5"},
           {"104 0x65\n256 108\n", "line 5"},
           {"104 101\n", "line 6"},
           {"104 101\n256 108\nextra\n", "line 7"},
           {"104 101\n257 108\n", "line 6"}}) {
    INFO(body);
    CHECK_THAT(error_of([&] { data::Tokenizer::parse_text(head + body, "t.tok"); }),
               Contains("tokenizer t.tok: " + line));
  }
  CHECK_THAT(error_of([&] {
               data::Tokenizer::parse_text(
                   "modtrain-tokenizer 1\nkind bpe\nvocab_size 1152921504606847232\nmerges "
                   "1152921504606846976\n",
                   "t.tok");
             }),
             Contains("line 3"));
  CHECK_THAT(error_of([&] {
               data::Tokenizer::parse_text(
                   "modtrain-tokenizer 1\nkind bpe\nvocab_size 2000256\nmerges 2000000\n1 2\n", "t.tok");
             }),
             Contains("room"));
}

TEST_CASE("a corrupted TensorBoard event file is refused on resume, not cut back", "[inputs]") {
  ScratchDir dir("tbcorrupt");
  std::string path;
  {
    metrics::TensorBoardWriter w(dir.str());
    for (int s = 1; s <= 6; ++s) w.scalar("loss", 1.0 / s, s);
    w.flush();
    path = w.path();
  }
  std::string bytes = file_text(path);
  const std::string intact = bytes;
  bytes[bytes.size() / 2] ^= 0x20;  // inside a record that has others after it
  write_bytes(path, bytes);
  CHECK_THAT(error_of([&] { metrics::TensorBoardWriter::truncate_after(dir.str(), 3); }),
             Contains(path) && Contains("corrupt"));
  CHECK(file_text(path) == bytes);  // kept as it was
  write_bytes(path, intact + intact.substr(0, 30));  // a torn tail is still dropped
  metrics::TensorBoardWriter::truncate_after(dir.str(), 3);
  CHECK(file_text(path).size() < intact.size());
}

TEST_CASE("token shard headers with inconsistent width or llm.c reserved words are refused", "[inputs]") {
  ScratchDir dir("shardhdr");
  const std::string path = dir.str() + "/s.bin";
  std::string h(32, '\0');
  const uint32_t v[] = {1, 4, 256, 0};
  std::memcpy(h.data(), "MODTOKS1", 8);
  std::memcpy(h.data() + 8, v, 16);
  write_bytes(path, h);
  CHECK_THAT(error_of([&] { data::TokenFile::open(path, modtrain::data::MODTRAIN, 0); }),
             Contains(path) && Contains("token width 4"));
  std::string llmc(1024, '\0');
  const int32_t l[] = {20240520, 1, 0};
  std::memcpy(llmc.data(), l, 12);
  write_bytes(path, llmc);
  CHECK_NOTHROW(data::TokenFile::open(path, modtrain::data::LLMC, 256));
  llmc[500] = 1;
  write_bytes(path, llmc);
  CHECK_THAT(error_of([&] { data::TokenFile::open(path, modtrain::data::LLMC, 256); }),
             Contains("llm.c header: int 125"));
}

TEST_CASE("safetensors lengths and shapes are checked against the file before allocating", "[inputs]") {
  const unsigned char huge[8] = {0, 0, 0, 0x80, 2, 0, 0, 0};  // a 10 GB header length
  CHECK_THAT(error_of([&] { safetensors_header_length(huge, 100, "w.st"); }),
             Contains("w.st") && Contains("does not fit"));
  CHECK_THAT(error_of([&] {
               parse_safetensors_header(
                   R"({"t":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,16]}})",
                   200, "w.st");
             }),
             Contains("tensor 't'"));
  CHECK_THAT(error_of([&] { parse_safetensors_header(std::string(5000, '[') , 6000, "w.st"); }),
             Contains("nests deeper"));
  CHECK_THAT(error_of([&] { parse_safetensors_header(R"({"t":{"dtype":"F32"}})", 100, "w.st"); }),
             Contains("needs shape"));
}
