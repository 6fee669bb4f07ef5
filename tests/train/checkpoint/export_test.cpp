// Export: a tiny model's parameters saved as checkpoint entries (some in two pieces, with
// optimizer moments beside them) export to a safetensors file that train::load_weights reads
// back as the same model, bitwise. The hidden case [.export_fixture] writes such a run for
// export_cli_test.sh (the modtrain command and the Python safetensors check).
#include "train/checkpoint/export.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/util/crc32c.h"
#include "core/util/safetensors.h"
#include "core/util/safetensors_header.h"
#include "model/transformer.h"
#include "tests/support/errors.h"
#include "tests/support/tiny_configs.h"
#include "tests/train/checkpoint/helpers.h"
#include "train/checkpoint/writer.h"
#include "train/weights.h"

using namespace mod;
using namespace mod::test;

namespace {

modtrain::RunConfig tiny_run() {
  modtrain::RunConfig cfg;
  cfg.set_name("export_test");
  *cfg.mutable_model() = tiny_model(true);
  cfg.mutable_train()->set_seed(7);
  return cfg;
}

// The model's parameters as a trainer would save them: matrices in two row pieces (as from two
// tensor-parallel ranks), vectors whole, and AdamW moments beside them.
void save_model(const std::string& run_dir, const model::Transformer& m,
                const modtrain::RunConfig& cfg, int64_t step) {
  std::vector<ckpt::TensorEntry> entries;
  for (const auto& [name, p] : m.named_parameters()) {
    if (p.dim() == 2 && p.size(0) % 2 == 0) {
      entries.push_back(piece("model/" + name, p, 0, 0, 2));
      entries.push_back(piece("model/" + name, p, 0, 1, 2));
    } else {
      entries.push_back(whole("model/" + name, p));
    }
    entries.push_back(whole("optim/m/" + name, Tensor::zeros(p.shape())));
  }
  ckpt::TrainState state;
  state.config = cfg;
  state.step = step;
  auto comm = parallel::make_local_communicator();
  ckpt::Checkpointer(run_dir, *comm).save(entries, state);
}

}  // namespace

TEST_CASE("an exported checkpoint loads with train::load_weights as the same model",
          "[checkpoint]") {
  ScratchDir run("export");
  const modtrain::RunConfig cfg = tiny_run();
  const model::Transformer m(cfg.model(), cfg.train().seed());
  save_model(run.str(), m, cfg, 12);
  const std::string out = run.str() + "/model.safetensors";
  const ckpt::ExportSummary s = ckpt::export_safetensors(run.str(), out);  // via `latest`
  CHECK(s.checkpoint == run.str() + "/checkpoints/step_00000012");
  CHECK(s.step == 12);
  CHECK(s.tensors == static_cast<int64_t>(m.named_parameters().size()));
  CHECK(s.bytes == m.num_parameters() * 4);

  const train::LoadedModel loaded = train::load_weights(out);
  CHECK(loaded.step == 12);
  CHECK(loaded.config.name() == "export_test");
  CHECK(loaded.config.model().SerializeAsString() == cfg.model().SerializeAsString());
  const auto want = m.named_parameters(), got = loaded.model->named_parameters();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(want[i].first);
    CHECK(got[i].first == want[i].first);
    CHECK(bitwise_equal(got[i].second, want[i].second));
  }
  // A checkpoint directory works as well as a run directory.
  CHECK(ckpt::export_safetensors(s.checkpoint, out).tensors == s.tensors);
}

namespace {
// Flips the lowest byte of the first float of tensor `name` (the value stays finite, so only the
// seal can tell) and returns the tensor's data offset in the file.
void flip_data_byte(const std::string& path, const std::string& name) {
  const SafetensorsIndex index = read_safetensors_index(path);
  for (const SafetensorsEntry& e : index.tensors) {
    if (e.name != name) continue;
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(index.data_start + e.begin);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x01);
    f.seekp(at);
    f.write(&c, 1);
    return;
  }
  FAIL("no tensor " << name << " in " << path);
}
}  // namespace

TEST_CASE("a flipped data byte in an exported file is refused, naming the file and the tensor",
          "[checkpoint]") {
  ScratchDir run("seal");
  const modtrain::RunConfig cfg = tiny_run();
  const model::Transformer m(cfg.model(), cfg.train().seed());
  save_model(run.str(), m, cfg, 5);
  const std::string out = run.str() + "/exported.safetensors";
  ckpt::export_safetensors(run.str(), out);
  const std::string victim = m.named_parameters().back().first;
  flip_data_byte(out, victim);
  const std::string error = error_of([&] { train::load_weights(out); });
  CHECK_THAT(error, Catch::Contains(out) && Catch::Contains("tensor '" + victim + "'") &&
                        Catch::Contains("CRC-32C"));
}

namespace {
// A safetensors file from its header text and data bytes.
std::string raw_safetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

// What fn writes to stderr, through the file at `capture`.
std::string stderr_of(const std::function<void()>& fn, const std::string& capture) {
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(capture.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(fd, 2);
  ::close(fd);
  const std::string error = error_of(fn);
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  INFO(error);
  CHECK(error == "no error");
  std::ifstream in(capture);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("an unsealed file (another tool's) loads, with one note per file", "[checkpoint]") {
  ScratchDir dir("unsealed");
  const std::string path = dir.str() + "/other_tool.safetensors";
  write_bytes(path, raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                    std::string(8, '\0')));
  const std::string note = stderr_of(
      [&] {
        CHECK(load_safetensors(path).tensors.count("a") == 1);
        CHECK(load_safetensors(path).tensors.count("a") == 1);
      },
      dir.str() + "/stderr.txt");
  CHECK(count_of(note, "note: safetensors " + path + " has no CRC-32C seal") == 1);
  CHECK(count_of(note, "\n") == 1);
}

TEST_CASE("the seal covers exactly the file's tensors, and the writer reserves its keys",
          "[checkpoint]") {
  ScratchDir dir("seal_keys");
  const std::string path = dir.str() + "/w.safetensors";
  const std::string data(8, '\0');
  const std::string seal_a = crc32c_text(crc32c(data.data(), 8));
  const std::string tensor_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  write_bytes(path, raw_safetensors(R"({"__metadata__":{"crc32c.a":")" + seal_a +
                                        R"(","crc32c.ghost":"00000000"},)" + tensor_a + "}",
                                    data));
  CHECK_THAT(error_of([&] { load_safetensors(path); }),
             Catch::Contains(path) && Catch::Contains("the seal names tensor 'ghost'"));
  write_bytes(path,
              raw_safetensors(R"({"__metadata__":{"crc32c.a":")" + seal_a + R"("},)" + tensor_a +
                                  R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                              data + std::string(4, '\0')));
  CHECK_THAT(error_of([&] { load_safetensors(path); }),
             Catch::Contains(path) && Catch::Contains("tensor 'b' has no seal"));
  write_bytes(path,
              raw_safetensors(R"({"__metadata__":{"crc32c.a":"A1B2"},)" + tensor_a + "}", data));
  CHECK_THAT(error_of([&] { load_safetensors(path); }),
             Catch::Contains("metadata crc32c.a: 'A1B2' is not a CRC-32C"));

  CHECK_THAT(error_of([&] {
               save_safetensors(path, {}, {{"crc32c.x", "00000000"}});
             }),
             Catch::Contains("'crc32c.x' is reserved for the seal"));
  save_safetensors(path, {{"w", counting({2, 3})}}, {{"step", "1"}});
  const SafetensorsIndex index = read_safetensors_index(path);
  CHECK(index.sealed);
  CHECK(index.metadata == std::map<std::string, std::string>{{"step", "1"}});
  REQUIRE(index.tensors.size() == 1);
  const Tensor w = counting({2, 3});
  CHECK(index.tensors[0].crc32c == crc32c(w.raw_data(), w.nbytes()));
}

TEST_CASE("a flipped header byte in a sealed file gives an error naming the file, or loads",
          "[checkpoint]") {
  ScratchDir run("seal_header");
  const modtrain::RunConfig cfg = tiny_run();
  const model::Transformer m(cfg.model(), cfg.train().seed());
  const std::string good = run.str() + "/good.safetensors", bad = run.str() + "/bad.safetensors";
  train::save_weights(good, m, cfg, 4);
  std::ifstream in(good, std::ios::binary);
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  const uint64_t data_start = read_safetensors_index(good).data_start;
  int refused = 0;
  for (uint64_t i = 0; i < data_start; ++i) {  // the length, then the JSON header
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x20);
    write_bytes(bad, flipped);
    const std::string error = error_of([&] { train::load_weights(bad); });
    INFO("byte " << i << ": " << error);
    CHECK((error == "no error" || error.find(bad) != std::string::npos));
    refused += error != "no error";
  }
  CHECK(refused > static_cast<int>(data_start) / 2);
}

TEST_CASE("export fixture for export_cli_test.sh", "[.export_fixture]") {
  const char* dir = std::getenv("MOD_EXPORT_FIXTURE_DIR");
  REQUIRE(dir);
  const modtrain::RunConfig cfg = tiny_run();
  const model::Transformer m(cfg.model(), cfg.train().seed());
  save_model(std::string(dir) + "/run", m, cfg, 3);
  train::save_weights(std::string(dir) + "/expected.safetensors", m, cfg, 3);
}
