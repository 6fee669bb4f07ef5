// `modtrain eval`'s table: each loss is labelled by the routing it ran with, and a dense model's
// only loss is not called top-C routing.
#include "train/inference.h"

#include <catch2/catch.hpp>

using namespace mod;
using Catch::Matchers::Contains;

TEST_CASE("eval labels a dense model's loss dense and a routed model's by its routings", "[eval]") {
  train::WeightsEval r;
  r.name = "tiny";
  r.step = 30;
  r.data_dir = "data/kjv";
  r.tokens = 4096;
  r.top_c_loss = 1.5;

  r.routed = false;
  const std::string dense = train::eval_table(r);
  CHECK_THAT(dense, Contains("tiny (step 30) on the validation split of data/kjv, 4096 tokens"));
  CHECK_THAT(dense, Contains("validation loss, dense (no routed blocks):  1.50000\n"));
  CHECK_THAT(dense, !Contains("top-C") && !Contains("causal"));

  r.routed = true;
  r.causal_loss = 1.625;
  const std::string routed = train::eval_table(r);
  CHECK_THAT(routed, Contains("validation loss, top-C routing (training):  1.50000\n"));
  CHECK_THAT(routed, Contains("validation loss, causal routing (sampling): 1.62500\n"));
  CHECK_THAT(routed, !Contains("dense"));
}
