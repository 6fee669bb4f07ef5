// Shapes, the correctness check and the timing of blas_sgemm (blas_timing.h).
#include "benchmarks/blas/blas_timing.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace mod::blas_bench {

std::vector<GemmCase> transformer_cases(const ModelShape& shape) {
  const long tokens = shape.tokens;
  const std::pair<long, long> out_in[] = {
      {shape.d_model, shape.d_model}, {shape.d_ff, shape.d_model}, {shape.d_model, shape.d_ff}};
  std::vector<GemmCase> cases;
  for (auto [n_out, k_in] : out_in) {
    auto dims = [](long m, long n, long k) {
      return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    };
    cases.push_back({"NN " + dims(tokens, n_out, k_in) + " (x@W)", 'N', 'N', tokens, n_out, k_in});
    cases.push_back(
        {"NT " + dims(tokens, n_out, k_in) + " (x@W^T)", 'N', 'T', tokens, n_out, k_in});
    // C[n_out, k_in] = dY[tokens, n_out]^T X[tokens, k_in]: M=n_out, N=k_in, K=tokens.
    cases.push_back(
        {"TN " + dims(n_out, k_in, tokens) + " (dY^T@X)", 'T', 'N', n_out, k_in, tokens});
  }
  return cases;
}

void fill_random(std::vector<float>& values, unsigned seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
  for (auto& value : values) value = distribution(generator);
}

// Compares against a double-precision reference on an odd shape with padded
// leading dimensions, nonzero beta and all four transposes.
void check_correctness(const BlasLibrary& library, int threads) {
  constexpr long m = 67, n = 45, k = 33, pad = 3;
  constexpr float alpha = 0.75f, beta = -0.5f;
  for (char transa : {'N', 'T'}) {
    for (char transb : {'N', 'T'}) {
      long a_rows = transa == 'N' ? m : k, a_cols = transa == 'N' ? k : m;
      long b_rows = transb == 'N' ? k : n, b_cols = transb == 'N' ? n : k;
      long lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
      std::vector<float> a(a_rows * lda), b(b_rows * ldb), c(m * ldc);
      fill_random(a, 1), fill_random(b, 2), fill_random(c, 3);
      std::vector<float> c_initial = c;
      library.set_threads(threads);
      library.sgemm(transa, transb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(),
                    ldc);
      auto a_at = [&](long i, long p) { return transa == 'N' ? a[i * lda + p] : a[p * lda + i]; };
      auto b_at = [&](long p, long j) { return transb == 'N' ? b[p * ldb + j] : b[j * ldb + p]; };
      for (long i = 0; i < m; ++i) {
        for (long j = 0; j < ldc; ++j) {
          double expected = c_initial[i * ldc + j], magnitude = 0.0;
          if (j < n) {
            double sum = 0.0;
            for (long p = 0; p < k; ++p) {
              sum += double(a_at(i, p)) * double(b_at(p, j));
              magnitude += std::abs(double(a_at(i, p)) * double(b_at(p, j)));
            }
            expected = alpha * sum + beta * expected;
            magnitude =
                std::abs(alpha) * magnitude + std::abs(beta * double(c_initial[i * ldc + j]));
          }
          // Padding columns must be left untouched, hence the exact compare there.
          double tolerance = j < n ? 1e-5 * magnitude + 1e-6 : 0.0;
          double error = std::abs(double(c[i * ldc + j]) - expected);
          if (!(error <= tolerance)) {
            char message[256];
            std::snprintf(message, sizeof message,
                          "%s sgemm wrong for trans%c%c %ldx%ldx%ld with %d threads "
                          "at C[%ld,%ld]: got %.7g, expected %.7g",
                          library.name.c_str(), transa, transb, m, n, k, threads, i, j,
                          double(c[i * ldc + j]), expected);
            fail(message);
          }
        }
      }
    }
  }
}

namespace {

double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto to_seconds = [](const timeval& value) {
    return double(value.tv_sec) + 1e-6 * double(value.tv_usec);
  };
  return to_seconds(usage.ru_utime) + to_seconds(usage.ru_stime);
}

// One library on one shape: a fixed batch of calls, timed as a unit.
struct CaseRunner {
  const BlasLibrary& library;
  const GemmCase& shape;
  int threads;
  float* a;
  float* b;
  float* c;
  long calls = 1;

  BatchTiming run_batch(long count) const {
    long lda = shape.transa == 'N' ? shape.k : shape.m;
    long ldb = shape.transb == 'N' ? shape.n : shape.k;
    library.set_threads(threads);
    double cpu_start = process_cpu_seconds();
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < count; ++i)
      library.sgemm(shape.transa, shape.transb, shape.m, shape.n, shape.k, 1.0f, a, lda, b, ldb,
                    0.0f, c, shape.n);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return {seconds, (process_cpu_seconds() - cpu_start) / (seconds * threads)};
  }

  // Warm-up (thread pool start, packing buffers, page faults on C), then
  // grow the batch until it lasts at least batch_seconds.
  void calibrate(double batch_seconds) {
    run_batch(2);
    calls = 1;
    for (double seconds = run_batch(calls).seconds; seconds < batch_seconds;
         seconds = run_batch(calls).seconds)
      calls = std::max(calls + 1, long(calls * 1.2 * batch_seconds / std::max(seconds, 1e-6)));
  }
};

}  // namespace

// Times every library on one shape and thread count, round-robin across
// libraries so that a burst of outside load hits all of them alike. Runs until
// each library has `timings` uncontended batches (>= timings x batch_seconds)
// or max_case_seconds pass; then keeps the best and median batch, taken from
// the uncontended ones where there are any.
std::vector<Measurement> time_case(const std::vector<BlasLibrary>& libraries, const GemmCase& shape,
                                   int threads, float* a, float* b, float* c, double batch_seconds,
                                   int timings, double max_case_seconds) {
  auto start = std::chrono::steady_clock::now();
  std::vector<CaseRunner> runners;
  for (const auto& library : libraries) {
    runners.push_back({library, shape, threads, a, b, c});
    runners.back().calibrate(batch_seconds);
  }
  std::vector<std::vector<BatchTiming>> clean(runners.size()), contended(runners.size());
  for (int round = 0;; ++round) {
    bool done = true;
    for (size_t l = 0; l < runners.size(); ++l) {
      if (round >= timings && int(clean[l].size()) >= timings) continue;
      done = false;
      BatchTiming timing = runners[l].run_batch(runners[l].calls);
      timing.seconds /= double(runners[l].calls);
      (timing.cpu_share >= kContendedShare ? clean : contended)[l].push_back(timing);
    }
    double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (done || (round + 1 >= timings && elapsed > max_case_seconds)) break;
  }
  double flops = 2.0 * double(shape.m) * double(shape.n) * double(shape.k);
  std::vector<Measurement> results;
  for (size_t l = 0; l < runners.size(); ++l) {
    auto& per_call = clean[l].empty() ? contended[l] : clean[l];
    std::sort(per_call.begin(), per_call.end(),
              [](const BatchTiming& x, const BatchTiming& y) { return x.seconds < y.seconds; });
    results.push_back({flops / per_call.front().seconds * 1e-9,
                       flops / per_call[per_call.size() / 2].seconds * 1e-9,
                       per_call.front().cpu_share});
  }
  return results;
}

}  // namespace mod::blas_bench
