// Export: a tiny model's parameters saved as checkpoint entries (some in two pieces, with
// optimizer moments beside them) export to a safetensors file that train::load_weights reads
// back as the same model, bitwise. The hidden case [.export_fixture] writes such a run for
// export_cli_test.sh (the modtrain command and the Python safetensors check).
#include "train/checkpoint/export.h"

#include <catch2/catch.hpp>
#include <cstdlib>

#include "model/transformer.h"
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

TEST_CASE("export fixture for export_cli_test.sh", "[.export_fixture]") {
  const char* dir = std::getenv("MOD_EXPORT_FIXTURE_DIR");
  REQUIRE(dir);
  const modtrain::RunConfig cfg = tiny_run();
  const model::Transformer m(cfg.model(), cfg.train().seed());
  save_model(std::string(dir) + "/run", m, cfg, 3);
  train::save_weights(std::string(dir) + "/expected.safetensors", m, cfg, 3);
}
