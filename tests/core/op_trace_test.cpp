// The CPU op trace behind train.profile_steps on a CPU: one record per outermost op, GEMMs named
// by layout and shape with their FLOPs, nothing recorded outside a trace or on other threads.
#include <catch2/catch.hpp>

#include <thread>

#include "core/backend.h"
#include "core/cpu/op_trace.h"
#include "core/tensor.h"

using mod::DeviceActivity;
using mod::Tensor;

TEST_CASE("the CPU op trace records each outermost op once, GEMMs with shape and FLOPs", "[profile]") {
  mod::Backend& be = mod::backend(mod::Device::CPU);
  Tensor a = Tensor::zeros({4, 6}), b = Tensor::zeros({5, 6}), c = Tensor::zeros({4, 5});
  mod::GemmArgs g;
  g.m = 4;
  g.n = 5;
  g.k = 6;
  g.trans_b = true;
  be.gemm(g, a, b, c);  // before the trace: not recorded

  mod::cpu::start_op_trace();
  CHECK_THROWS_AS(mod::cpu::start_op_trace(), std::logic_error);
  be.gemm(g, a, b, c);  // its dispatch_float scope sits inside the gemm's: one record
  be.axpy(2.0, c, c);
  std::thread([&] { be.scale(c, 3.0, c); }).join();  // another thread: not recorded
  const std::vector<DeviceActivity> r = mod::cpu::stop_op_trace();
  be.axpy(2.0, c, c);  // after the trace: not recorded

  REQUIRE(r.size() == 2);
  CHECK(r[0].name == "gemm NT 4x5x6");
  CHECK(r[0].flop == 2.0 * 4 * 5 * 6);
  CHECK(r[1].name == "axpy");
  CHECK(r[1].flop == 0);
  CHECK(r[0].start_ns <= r[0].end_ns);
  CHECK(r[0].end_ns <= r[1].start_ns);  // the inner scope left the depth as it found it
  CHECK(r[1].start_ns <= r[1].end_ns);
  CHECK(mod::cpu::stop_op_trace().empty());
}
