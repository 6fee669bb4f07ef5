// blas_sgemm's measurements: the GEMM shapes of a transformer's linear layers, the check
// against a double-precision reference, and round-robin timing of every library on one shape
// that keeps batches slowed by other load on the host out of the figures where it can.
#pragma once

#include <string>
#include <vector>

#include "benchmarks/blas/blas_libraries.h"

namespace mod::blas_bench {

struct GemmCase {
  std::string label;
  char transa;
  char transb;
  long m;
  long n;
  long k;
};

// Forward x@W, forward x@W^T, and weight gradient dW = dY^T X for the three
// linear-layer shapes of a transformer (default d_model=768, d_ff=3072 at 4096 tokens).
struct ModelShape {
  long d_model = 768, d_ff = 3072, tokens = 4096;
};

std::vector<GemmCase> transformer_cases(const ModelShape& shape);

// Values uniform in [-1, 1) from a fixed seed.
void fill_random(std::vector<float>& values, unsigned seed);

// Compares against a double-precision reference on an odd shape with padded
// leading dimensions, nonzero beta and all four transposes.
void check_correctness(const BlasLibrary& library, int threads);

struct Measurement {
  double best_gflops;
  double median_gflops;
  // CPU time this process got during the best batch / (wall time x threads);
  // well below 1 means other processes took cores from the benchmark.
  double best_cpu_share;
};

struct BatchTiming {
  double seconds;
  double cpu_share;
};

// A batch in which the process got less than this share of its threads' CPU
// time was slowed by other load on the host and is not used when avoidable.
constexpr double kContendedShare = 0.9;

// Times every library on one shape and thread count, round-robin across
// libraries so that a burst of outside load hits all of them alike. Runs until
// each library has `timings` uncontended batches (>= timings x batch_seconds)
// or max_case_seconds pass; then keeps the best and median batch, taken from
// the uncontended ones where there are any.
std::vector<Measurement> time_case(const std::vector<BlasLibrary>& libraries, const GemmCase& shape,
                                   int threads, float* a, float* b, float* c, double batch_seconds,
                                   int timings, double max_case_seconds);

}  // namespace mod::blas_bench
