// SGEMM throughput benchmark: OpenBLAS vs BLIS vs oneDNN on small-transformer
// shapes, each library loaded at run time with dlopen so their identically
// named cblas_sgemm symbols never clash.
//
// Build:  g++ -O2 -std=c++20 -fopenmp -I. benchmarks/blas/blas_*.cpp -ldl -o /tmp/blas_sgemm
// Run:    /tmp/blas_sgemm [--threads=1,2] [--libraries=openblas,blis,onednn]
//                         [--openblas-coretype=NAME] [--batch-seconds=0.1]
//                         [--timings=5] [--max-case-seconds=12]
//                         [--model=D_MODEL,D_FF,TOKENS]   (default 768,3072,4096)
//
// --openblas-coretype=NAME sets OPENBLAS_CORETYPE before OpenBLAS is loaded;
// OpenBLAS reads it only once, at load time, so compare core types by running
// the binary twice.

//
// This file: options, the report and main; the libraries are in blas_libraries.h, the shapes,
// check and timing in blas_timing.h, the CPU's peak in blas_cpu.h.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "benchmarks/blas/blas_cpu.h"
#include "benchmarks/blas/blas_libraries.h"
#include "benchmarks/blas/blas_timing.h"

using namespace mod::blas_bench;

namespace {

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> items;
  std::stringstream stream{std::string(text)};
  for (std::string item; std::getline(stream, item, ',');)
    if (!item.empty()) items.push_back(item);
  return items;
}

void print_usage() {
  std::printf(
      "usage: blas_sgemm [--threads=1,2] [--libraries=openblas,blis,onednn]\n"
      "                  [--openblas-coretype=NAME] [--batch-seconds=0.1] [--timings=5]\n"
      "                  [--max-case-seconds=12] [--model=D_MODEL,D_FF,TOKENS]\n");
}

// The command line (print_usage); defaults as there.
struct Options {
  std::vector<int> thread_counts = {1, 2};
  std::vector<std::string> library_names = {"openblas", "blis", "onednn"};
  double batch_seconds = 0.1;
  int timings = 5;
  double max_case_seconds = 12.0;
  ModelShape shape;
  bool help = false;
};

// --name=value arguments; --openblas-coretype sets the variable at once. Fails on anything else.
Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view argument = argv[i];
    auto value_after = [&](std::string_view prefix) -> std::string_view {
      return argument.rfind(prefix, 0) == 0 ? argument.substr(prefix.size()) : std::string_view();
    };
    if (argument == "--help") {
      o.help = true;
      return o;
    } else if (auto value = value_after("--threads="); !value.empty()) {
      o.thread_counts.clear();
      for (const auto& item : split_list(value)) o.thread_counts.push_back(std::atoi(item.c_str()));
    } else if (auto value = value_after("--libraries="); !value.empty()) {
      o.library_names = split_list(value);
    } else if (auto value = value_after("--openblas-coretype="); !value.empty()) {
      // Must precede dlopen: OpenBLAS picks its kernels in a load-time constructor.
      setenv("OPENBLAS_CORETYPE", std::string(value).c_str(), 1);
    } else if (auto value = value_after("--batch-seconds="); !value.empty()) {
      o.batch_seconds = std::atof(std::string(value).c_str());
    } else if (auto value = value_after("--max-case-seconds="); !value.empty()) {
      o.max_case_seconds = std::atof(std::string(value).c_str());
    } else if (auto value = value_after("--model="); !value.empty()) {
      const auto dims = split_list(value);
      if (dims.size() != 3) fail("--model=D_MODEL,D_FF,TOKENS expects 3 numbers");
      o.shape = {std::atol(dims[0].c_str()), std::atol(dims[1].c_str()),
                 std::atol(dims[2].c_str())};
      if (o.shape.d_model < 1 || o.shape.d_ff < 1 || o.shape.tokens < 1)
        fail("--model values must be positive");
    } else if (auto value = value_after("--timings="); !value.empty()) {
      o.timings = std::max(1, std::atoi(std::string(value).c_str()));
    } else {
      print_usage();
      fail("unknown argument " + std::string(argument));
    }
  }
  for (int threads : o.thread_counts)
    if (threads < 1) fail("thread counts must be positive");
  return o;
}

// The CPU, its theoretical and measured-clock peaks, and each library's kernel report. An
// implausibly low all-core clock reading is replaced by the 1-core one.
void print_machine(CpuDescription& cpu, const std::vector<BlasLibrary>& libraries) {
  std::printf("# SGEMM benchmark\n\n");
  std::printf("CPU: %s; %d cores; %.3f GHz; %s\n", cpu.model.c_str(), cpu.cores, cpu.ghz,
              cpu.isa.c_str());
  std::printf(
      "Theoretical fp32 peak: %d cores x %.3f GHz x %d FLOP/cycle = %.1f GFLOP/s "
      "(%.1f GFLOP/s per core)\n",
      cpu.cores, cpu.ghz, cpu.flops_per_cycle, cpu.cores * cpu.ghz * cpu.flops_per_cycle,
      cpu.ghz * cpu.flops_per_cycle);
  if (cpu.measured_ghz_all < 0.85 * cpu.measured_ghz_one) {
    // A thread that got descheduled reads as a slow clock; do not trust it.
    std::printf(
        "All-core clock read %.2f GHz, likely other load on the host; using the "
        "1-core clock instead\n",
        cpu.measured_ghz_all);
    cpu.measured_ghz_all = cpu.measured_ghz_one;
  }
  std::printf(
      "Measured core clock (dependent-add loop): %.2f GHz with 1 core busy, %.2f GHz "
      "with %d busy; peak at that clock: %.1f GFLOP/s (1 core), %.1f GFLOP/s (%d cores)\n\n",
      cpu.measured_ghz_one, cpu.measured_ghz_all, cpu.cores,
      cpu.measured_ghz_one * cpu.flops_per_cycle,
      cpu.cores * cpu.measured_ghz_all * cpu.flops_per_cycle, cpu.cores);
  for (const auto& library : libraries)
    std::printf("- %s: %s; %s\n", library.name.c_str(), library.path.c_str(),
                library.kernel_info.c_str());
  std::printf("\n");
}

// results[case][library * thread counts + thread index]; progress lines on stderr.
std::vector<std::vector<Measurement>> measure(const std::vector<BlasLibrary>& libraries,
                                              const std::vector<GemmCase>& cases,
                                              const Options& o) {
  const std::vector<int>& thread_counts = o.thread_counts;
  size_t largest = 0;
  for (const auto& shape : cases)
    largest = std::max(
        {largest, size_t(shape.m * shape.k), size_t(shape.k * shape.n), size_t(shape.m * shape.n)});
  auto allocate = [&](unsigned seed) {
    // 64-byte alignment so no library is penalised by a split first cache line.
    size_t bytes = (largest * sizeof(float) + 63) / 64 * 64;
    float* data = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!data) fail("out of memory");
    std::vector<float> values(largest);
    fill_random(values, seed);
    std::memcpy(data, values.data(), largest * sizeof(float));
    return std::unique_ptr<float, decltype(&std::free)>(data, &std::free);
  };
  auto a = allocate(11), b = allocate(12), c = allocate(13);

  std::vector<std::vector<Measurement>> results(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    results[i].resize(libraries.size() * thread_counts.size());
    for (size_t t = 0; t < thread_counts.size(); ++t) {
      auto per_library = time_case(libraries, cases[i], thread_counts[t], a.get(), b.get(), c.get(),
                                   o.batch_seconds, o.timings, o.max_case_seconds);
      for (size_t l = 0; l < libraries.size(); ++l) {
        results[i][l * thread_counts.size() + t] = per_library[l];
        std::fprintf(stderr, "%-34s %-8s %dT best %6.1f median %6.1f GFLOP/s cpu share %.2f\n",
                     cases[i].label.c_str(), libraries[l].name.c_str(), thread_counts[t],
                     per_library[l].best_gflops, per_library[l].median_gflops,
                     per_library[l].best_cpu_share);
      }
    }
  }
  return results;
}

// One markdown table of best or median GFLOP/s: a row per shape, a column per library and
// thread count, then geometric means, absolute and as a share of the measured-clock peak.
void print_table(const char* title, bool best, const std::vector<BlasLibrary>& libraries,
                 const std::vector<GemmCase>& cases,
                 const std::vector<std::vector<Measurement>>& results,
                 const std::vector<int>& thread_counts, const CpuDescription& cpu) {
  std::printf("%s\n\n| shape (MxNxK) |", title);
  for (const auto& library : libraries)
    for (int threads : thread_counts) std::printf(" %s %dT |", library.name.c_str(), threads);
  std::printf("\n|---|");
  for (size_t column = 0; column < libraries.size() * thread_counts.size(); ++column)
    std::printf("---:|");
  std::printf("\n");
  for (size_t i = 0; i < cases.size(); ++i) {
    std::printf("| %s |", cases[i].label.c_str());
    for (const auto& result : results[i])
      std::printf(" %.1f%s |", best ? result.best_gflops : result.median_gflops,
                  best && result.best_cpu_share < kContendedShare ? "*" : "");
    std::printf("\n");
  }
  std::printf("| geometric mean |");
  for (size_t column = 0; column < results[0].size(); ++column) {
    double log_sum = 0.0;
    for (const auto& row : results)
      log_sum += std::log(best ? row[column].best_gflops : row[column].median_gflops);
    std::printf(" %.1f |", std::exp(log_sum / double(results.size())));
  }
  // Relative to the measured clock; falls back to /proc/cpuinfo where unmeasured.
  std::printf("\n| geomean %% of peak at measured clock |");
  for (size_t column = 0; column < results[0].size(); ++column) {
    int threads = thread_counts[column % thread_counts.size()];
    double log_sum = 0.0;
    for (const auto& row : results)
      log_sum += std::log(best ? row[column].best_gflops : row[column].median_gflops);
    int busy = std::min(threads, cpu.cores);
    double ghz = busy == 1 ? cpu.measured_ghz_one : cpu.measured_ghz_all;
    double peak = busy * (ghz > 0.0 ? ghz : cpu.ghz) * cpu.flops_per_cycle;
    std::printf(" %.0f%% |", 100.0 * std::exp(log_sum / double(results.size())) / peak);
  }
  std::printf("\n\n");
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  if (o.help) {
    print_usage();
    return 0;
  }
  std::vector<BlasLibrary> libraries;
  for (const auto& name : o.library_names) libraries.push_back(load_library(name));

  CpuDescription cpu = describe_cpu();
  print_machine(cpu, libraries);
  for (const auto& library : libraries)
    for (int threads : o.thread_counts) check_correctness(library, threads);
  std::printf(
      "Correctness: all libraries match a double reference on 67x45x33, "
      "NN/NT/TN/TT, padded ld, beta != 0.\n\n");

  const std::vector<GemmCase> cases = transformer_cases(o.shape);
  const auto results = measure(libraries, cases, o);
  print_table("## GFLOP/s, best batch", true, libraries, cases, results, o.thread_counts, cpu);
  bool any_contended = false;
  for (const auto& row : results)
    for (const auto& result : row) any_contended |= result.best_cpu_share < kContendedShare;
  if (any_contended)
    std::printf(
        "\\* no batch got >= %.0f%% of its threads' CPU time within "
        "--max-case-seconds (other load on the host); the number is from contended "
        "batches.\n\n",
        100.0 * kContendedShare);
  print_table("## GFLOP/s, median batch", false, libraries, cases, results, o.thread_counts, cpu);
  return 0;
}
