// The CUDA-against-CPU harness of tests/cuda/parity_*_test.cpp: one Backend call runs on
// backend(Device::CPU) and backend(Device::CUDA) with the same arguments and preallocated
// outputs, and every output comes back from the GPU to be compared element by element.
//
// Tolerances, one table for every test. An element passes when
//   |gpu - cpu| <= rtol * (|cpu| + rms(cpu))
// where rms is over the output's finite elements: an entry that cancels to nearly zero is judged
// against the tensor's scale, not its own. Infinite and NaN reference values must match exactly;
// index outputs (top-k) and copies, conversions and fills must match bit for bit.
//   f64   rtol 1e-12; 1e-10 for attention and reductions over more than 10^4 elements
//   f32   rtol 1e-5;  1e-4  for attention and reductions over more than 10^4 elements
//   bf16  rtol 2e-2. bf16 has 8 bits of mantissa (7 stored), so one rounding is up to 2^-9 =
//         0.2% relative, and kernels round more than once (the output; P and dS in cuDNN
//         attention; bf16 accumulators in scatters). The GPU runs on bf16 copies of the inputs,
//         converted on the GPU with Backend::convert; the CPU, which has no bf16 kernels, runs
//         its f32 op on those same bf16 values read back; the GPU's bf16 result is widened to
//         f32 and compared with the CPU's.
// Backward tests take their cached statistics (rstd, lse, out) from the CPU's f64 forward on
// the inputs as rounded to the dtype under test, so each backward kernel is tested alone.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mod::parity {

// Tol::Long: attention, and reductions over more than 10^4 elements.
enum class Tol { Normal, Long };

struct Precision {
  DType dtype;      // what the GPU runs, e.g. BF16
  DType cpu_dtype;  // what the CPU reference runs: dtype, or F32 for BF16
  double rtol;
  double rtol_long;
  double tolerance(Tol tol) const { return tol == Tol::Long ? rtol_long : rtol; }
};
Precision precision(DType dtype);  // F64, F32 or BF16

// Every float dtype a GPU kernel takes; a test runs once per value:
//   const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
#define MOD_PARITY_DTYPES ::mod::DType::F64, ::mod::DType::F32, ::mod::DType::BF16

// One argument of a backend call. `value` is a CPU tensor: a float tensor's values in any float
// dtype (converted to the precision under test; f64 keeps them exact), or an index tensor used
// as it is on both devices.
struct Arg {
  enum class Role { In, Out, InOut };
  std::string name;  // for the failure message, e.g. "dq"
  Role role;
  Tensor value;
  bool f32_when_bf16 = false;  // a float tensor kept in f32 beside bf16 ones (see below)
};
Arg in(std::string name, Tensor value);
// Starts with these values (compared after the call): for kernels that accumulate (+=) or
// update in place, or must leave parts of a buffer alone.
Arg inout(std::string name, Tensor value);
// A pure output: float ones start as NaN and index ones as -1 on both devices, so an element the
// kernel never writes fails the comparison.
Arg out(std::string name, const Shape& shape, DType dtype = DType::F64);
// The same argument, stored in f32 when the precision under test is bf16: statistics that a
// kernel accepts in its accumulation dtype (attention's lse, which cuDNN keeps in f32).
Arg f32_when_bf16(Arg a);

// The call under test, given the backend and the arguments in the order of the Arg list.
using Call = std::function<void(Backend& b, std::vector<Tensor>& t)>;

// MOD_PARITY_OFFSET_BYTES=N places every GPU argument N bytes into a larger buffer (rounded up
// to whole elements), as a view, so kernels see the pointers a narrowed or sliced tensor gives
// them (CTest runs the suite at 2 and 16 bytes on the emulator): this dtype's offset in bytes.
int64_t offset_bytes(DType dtype);

// Runs call on the CPU and on the GPU at precision p and compares every Out and InOut argument
// (and checks that the GPU left every In argument as it was). Callers INFO the case first.
// scale_floor: the least scale an output is judged against (rms below it counts as it), for
// outputs that cancel to zero in exact arithmetic, whose rms is then rounding noise.
void check_parity(const Precision& p, const std::vector<Arg>& args, const Call& call,
                  Tol tol = Tol::Normal, double scale_floor = 0.0);

// got and want are CPU tensors of the same numel (any float dtypes): CHECKs the rule above and
// reports the worst element, its index and both values.
void expect_close(const std::string& what, const Tensor& got, const Tensor& want, double rtol,
                  double scale_floor = 0.0);
// Same values bit for bit as doubles (NaN matches NaN); reports the first mismatch.
void expect_equal(const std::string& what, const Tensor& got, const Tensor& want);

Backend& cpu();
Backend& gpu();

// f64 CPU tensors of seeded random values.
Tensor normal(const Shape& shape, Rng& rng, double std = 1.0, double mean = 0.0);
Tensor uniform(const Shape& shape, Rng& rng, double lo = 0.0, double hi = 1.0);
// f64 copy of master with every value rounded to dtype (F64, F32 or BF16, round to nearest
// even), so that a reference computed from it sees what the GPU sees.
Tensor rounded(const Tensor& master, DType dtype);
// A bf16, f32 or f64 GPU tensor with master's values, converted on the GPU for bf16.
Tensor to_gpu(const Tensor& master, DType dtype);

// Index helpers. Rows of positions: strictly increasing, as attention and rope see them.
Tensor indices(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::I64);
std::vector<int64_t> iota(int64_t n, int64_t start = 0);
// n sorted distinct values from [0, limit), drawn with rng (n <= limit).
std::vector<int64_t> sorted_subset(int64_t n, int64_t limit, Rng& rng);

}  // namespace mod::parity
