// SGEMM throughput benchmark: OpenBLAS vs BLIS vs oneDNN on small-transformer
// shapes, each library loaded at run time with dlopen so their identically
// named cblas_sgemm symbols never clash.
//
// Build:  g++ -O2 -std=c++20 -fopenmp benchmarks/blas_sgemm.cpp -ldl -o /tmp/blas_sgemm
// Run:    /tmp/blas_sgemm [--threads=1,2] [--libraries=openblas,blis,onednn]
//                         [--openblas-coretype=NAME] [--batch-seconds=0.1]
//                         [--timings=5] [--max-case-seconds=12]
//                         [--model=D_MODEL,D_FF,TOKENS]   (default 768,3072,4096)
//
// --openblas-coretype=NAME sets OPENBLAS_CORETYPE before OpenBLAS is loaded;
// OpenBLAS reads it only once, at load time, so compare core types by running
// the binary twice.

#include <dlfcn.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

// CBLAS enum values; fixed by the CBLAS standard, so no header is needed.
constexpr int cblas_row_major = 101;
constexpr int cblas_no_trans = 111;
constexpr int cblas_trans = 112;

// 32-bit integer CBLAS, as shipped by Debian's OpenBLAS and BLIS packages.
using cblas_sgemm_fn = void (*)(int order, int transa, int transb, int m, int n, int k,
                                float alpha, const float* a, int lda, const float* b,
                                int ldb, float beta, float* c, int ldc);
using openblas_set_num_threads_fn = void (*)(int);
using openblas_string_fn = char* (*)();
// BLIS dim_t is gint_t, which is 64-bit (signed long) on LP64 Linux.
using bli_thread_set_num_threads_fn = void (*)(long);
using bli_arch_query_id_fn = int (*)();
using bli_arch_string_fn = char* (*)(int);
using bli_info_string_fn = char* (*)();
// oneDNN's dnnl_sgemm is row-major with 64-bit dims and returns dnnl_status_t.
using dnnl_sgemm_fn = int (*)(char transa, char transb, long m, long n, long k, float alpha,
                              const float* a, long lda, const float* b, long ldb, float beta,
                              float* c, long ldc);
using dnnl_get_effective_cpu_isa_fn = int (*)();
struct dnnl_version_t {
    int major;
    int minor;
    int patch;
    const char* hash;
    unsigned cpu_runtime;
    unsigned gpu_runtime;
};
using dnnl_version_fn = const dnnl_version_t* (*)();

[[noreturn]] void fail(const std::string& message) {
    std::fprintf(stderr, "error: %s\n", message.c_str());
    std::exit(1);
}

void* load_first(const std::vector<std::string>& paths, std::string& loaded_path) {
    std::string errors;
    for (const auto& path : paths) {
        if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
            loaded_path = path;
            return handle;
        }
        errors += std::string("\n  ") + dlerror();
    }
    fail("could not load any of the candidate libraries:" + errors);
}

template <typename fn_type>
fn_type required_symbol(void* handle, const char* name, const std::string& library) {
    void* symbol = dlsym(handle, name);
    if (!symbol) fail("symbol " + std::string(name) + " missing from " + library);
    return reinterpret_cast<fn_type>(symbol);
}

template <typename fn_type>
fn_type optional_symbol(void* handle, const char* name) {
    return reinterpret_cast<fn_type>(dlsym(handle, name));
}

std::string dnnl_isa_name(int isa) {
    switch (isa) {
        case 0x0: return "all";
        case 0x1: return "sse41";
        case 0x3: return "avx";
        case 0x7: return "avx2";
        case 0xf: return "avx512_mic";
        case 0x1f: return "avx512_mic_4ops";
        case 0x27: return "avx512_core";
        case 0x67: return "avx512_core_vnni";
        case 0xe7: return "avx512_core_bf16";
        case 0x3e7: return "avx512_core_amx";
        case 0x407: return "avx2_vnni";
        default: {
            char buffer[32];
            std::snprintf(buffer, sizeof buffer, "isa 0x%x", isa);
            return buffer;
        }
    }
}

enum class library_kind { openblas, blis, onednn };

// One dlopen'ed BLAS with a uniform row-major sgemm entry point.
struct blas_library {
    library_kind kind;
    std::string name;
    std::string path;
    std::string kernel_info;
    cblas_sgemm_fn cblas_sgemm = nullptr;
    dnnl_sgemm_fn dnnl_sgemm = nullptr;
    openblas_set_num_threads_fn openblas_set_num_threads = nullptr;
    bli_thread_set_num_threads_fn bli_thread_set_num_threads = nullptr;

    void set_threads(int threads) const {
        // All three link the same libgomp as this binary. oneDNN and OpenBLAS's
        // OpenMP build take their thread count from the OpenMP ICV at call time
        // (openblas_set_num_threads rewrites that ICV, so the last call wins);
        // BLIS ignores the ICV and defaults to 1 thread without its own setter.
        omp_set_num_threads(threads);
        if (openblas_set_num_threads) openblas_set_num_threads(threads);
        if (bli_thread_set_num_threads) bli_thread_set_num_threads(threads);
    }

    void sgemm(char transa, char transb, long m, long n, long k, float alpha, const float* a,
               long lda, const float* b, long ldb, float beta, float* c, long ldc) const {
        if (dnnl_sgemm) {
            int status = dnnl_sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
            if (status != 0) fail("dnnl_sgemm returned status " + std::to_string(status));
            return;
        }
        cblas_sgemm(cblas_row_major, transa == 'T' ? cblas_trans : cblas_no_trans,
                    transb == 'T' ? cblas_trans : cblas_no_trans, int(m), int(n), int(k), alpha,
                    a, int(lda), b, int(ldb), beta, c, int(ldc));
    }
};

blas_library load_openblas() {
    blas_library library{library_kind::openblas, "OpenBLAS", "", ""};
    void* handle = load_first({"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                               "libopenblas.so.0"},
                              library.path);
    library.cblas_sgemm = required_symbol<cblas_sgemm_fn>(handle, "cblas_sgemm", library.path);
    library.openblas_set_num_threads = required_symbol<openblas_set_num_threads_fn>(
        handle, "openblas_set_num_threads", library.path);
    auto get_corename = optional_symbol<openblas_string_fn>(handle, "openblas_get_corename");
    auto get_config = optional_symbol<openblas_string_fn>(handle, "openblas_get_config");
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    library.kernel_info = std::string("openblas_get_corename()=") +
                          (get_corename ? get_corename() : "(symbol missing)") +
                          "; openblas_get_config()=\"" +
                          (get_config ? get_config() : "(symbol missing)") +
                          "\"; OPENBLAS_CORETYPE=" + (coretype ? coretype : "(unset)");
    return library;
}

blas_library load_blis() {
    blas_library library{library_kind::blis, "BLIS", "", ""};
    void* handle = load_first({"/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4",
                               "libblis.so.4"},
                              library.path);
    library.cblas_sgemm = required_symbol<cblas_sgemm_fn>(handle, "cblas_sgemm", library.path);
    library.bli_thread_set_num_threads = required_symbol<bli_thread_set_num_threads_fn>(
        handle, "bli_thread_set_num_threads", library.path);
    auto query_id = optional_symbol<bli_arch_query_id_fn>(handle, "bli_arch_query_id");
    auto arch_string = optional_symbol<bli_arch_string_fn>(handle, "bli_arch_string");
    auto version = optional_symbol<bli_info_string_fn>(handle, "bli_info_get_version_str");
    library.kernel_info = "bli_arch_query_id()=";
    if (query_id) {
        int id = query_id();
        library.kernel_info += std::to_string(id);
        if (arch_string) library.kernel_info += std::string(" (") + arch_string(id) + ")";
    } else {
        library.kernel_info += "(symbol missing)";
    }
    if (version) library.kernel_info += std::string("; version ") + version();
    return library;
}

blas_library load_onednn() {
    blas_library library{library_kind::onednn, "oneDNN", "", ""};
    void* handle = load_first({"libdnnl.so.2", "/usr/lib/x86_64-linux-gnu/libdnnl.so.2",
                               "libdnnl.so.3"},
                              library.path);
    library.dnnl_sgemm = required_symbol<dnnl_sgemm_fn>(handle, "dnnl_sgemm", library.path);
    auto effective_isa =
        optional_symbol<dnnl_get_effective_cpu_isa_fn>(handle, "dnnl_get_effective_cpu_isa");
    auto version = optional_symbol<dnnl_version_fn>(handle, "dnnl_version");
    library.kernel_info = "dnnl_get_effective_cpu_isa()=" +
                          (effective_isa ? dnnl_isa_name(effective_isa()) : "(symbol missing)");
    if (version) {
        const dnnl_version_t* v = version();
        library.kernel_info += "; version " + std::to_string(v->major) + "." +
                               std::to_string(v->minor) + "." + std::to_string(v->patch);
    }
    return library;
}

struct gemm_case {
    std::string label;
    char transa;
    char transb;
    long m;
    long n;
    long k;
};

// Forward x@W, forward x@W^T, and weight gradient dW = dY^T X for the three
// linear-layer shapes of a transformer (default d_model=768, d_ff=3072 at 4096 tokens).
struct model_shape {
    long d_model = 768, d_ff = 3072, tokens = 4096;
};

std::vector<gemm_case> transformer_cases(const model_shape& shape) {
    const long tokens = shape.tokens;
    const std::pair<long, long> out_in[] = {
        {shape.d_model, shape.d_model}, {shape.d_ff, shape.d_model}, {shape.d_model, shape.d_ff}};
    std::vector<gemm_case> cases;
    for (auto [n_out, k_in] : out_in) {
        auto dims = [](long m, long n, long k) {
            return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
        };
        cases.push_back({"NN " + dims(tokens, n_out, k_in) + " (x@W)", 'N', 'N', tokens, n_out,
                         k_in});
        cases.push_back({"NT " + dims(tokens, n_out, k_in) + " (x@W^T)", 'N', 'T', tokens, n_out,
                         k_in});
        // C[n_out, k_in] = dY[tokens, n_out]^T X[tokens, k_in]: M=n_out, N=k_in, K=tokens.
        cases.push_back({"TN " + dims(n_out, k_in, tokens) + " (dY^T@X)", 'T', 'N', n_out, k_in,
                         tokens});
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
void check_correctness(const blas_library& library, int threads) {
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
            library.sgemm(transa, transb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta,
                          c.data(), ldc);
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
                        magnitude = std::abs(alpha) * magnitude +
                                    std::abs(beta * double(c_initial[i * ldc + j]));
                    }
                    // Padding columns must be left untouched, hence the exact compare there.
                    double tolerance = j < n ? 1e-5 * magnitude + 1e-6 : 0.0;
                    double error = std::abs(double(c[i * ldc + j]) - expected);
                    if (!(error <= tolerance)) {
                        char message[256];
                        std::snprintf(message, sizeof message,
                                      "%s sgemm wrong for trans%c%c %ldx%ldx%ld with %d threads "
                                      "at C[%ld,%ld]: got %.7g, expected %.7g",
                                      library.name.c_str(), transa, transb, m, n, k, threads, i,
                                      j, double(c[i * ldc + j]), expected);
                        fail(message);
                    }
                }
            }
        }
    }
}

struct measurement {
    double best_gflops;
    double median_gflops;
    // CPU time this process got during the best batch / (wall time x threads);
    // well below 1 means other processes took cores from the benchmark.
    double best_cpu_share;
};

struct batch_timing {
    double seconds;
    double cpu_share;
};

double process_cpu_seconds() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    auto to_seconds = [](const timeval& value) { return double(value.tv_sec) + 1e-6 * double(value.tv_usec); };
    return to_seconds(usage.ru_utime) + to_seconds(usage.ru_stime);
}

// One library on one shape: a fixed batch of calls, timed as a unit.
struct case_runner {
    const blas_library& library;
    const gemm_case& shape;
    int threads;
    float* a;
    float* b;
    float* c;
    long calls = 1;

    batch_timing run_batch(long count) const {
        long lda = shape.transa == 'N' ? shape.k : shape.m;
        long ldb = shape.transb == 'N' ? shape.n : shape.k;
        library.set_threads(threads);
        double cpu_start = process_cpu_seconds();
        auto start = std::chrono::steady_clock::now();
        for (long i = 0; i < count; ++i)
            library.sgemm(shape.transa, shape.transb, shape.m, shape.n, shape.k, 1.0f, a, lda, b,
                          ldb, 0.0f, c, shape.n);
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

// A batch in which the process got less than this share of its threads' CPU
// time was slowed by other load on the host and is not used when avoidable.
constexpr double contended_share = 0.9;

// Times every library on one shape and thread count, round-robin across
// libraries so that a burst of outside load hits all of them alike. Runs until
// each library has `timings` uncontended batches (>= timings x batch_seconds)
// or max_case_seconds pass; then keeps the best and median batch, taken from
// the uncontended ones where there are any.
std::vector<measurement> time_case(const std::vector<blas_library>& libraries,
                                   const gemm_case& shape, int threads, float* a, float* b,
                                   float* c, double batch_seconds, int timings,
                                   double max_case_seconds) {
    auto start = std::chrono::steady_clock::now();
    std::vector<case_runner> runners;
    for (const auto& library : libraries) {
        runners.push_back({library, shape, threads, a, b, c});
        runners.back().calibrate(batch_seconds);
    }
    std::vector<std::vector<batch_timing>> clean(runners.size()), contended(runners.size());
    for (int round = 0;; ++round) {
        bool done = true;
        for (size_t l = 0; l < runners.size(); ++l) {
            if (round >= timings && int(clean[l].size()) >= timings) continue;
            done = false;
            batch_timing timing = runners[l].run_batch(runners[l].calls);
            timing.seconds /= double(runners[l].calls);
            (timing.cpu_share >= contended_share ? clean : contended)[l].push_back(timing);
        }
        double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (done || (round + 1 >= timings && elapsed > max_case_seconds)) break;
    }
    double flops = 2.0 * double(shape.m) * double(shape.n) * double(shape.k);
    std::vector<measurement> results;
    for (size_t l = 0; l < runners.size(); ++l) {
        auto& per_call = clean[l].empty() ? contended[l] : clean[l];
        std::sort(per_call.begin(), per_call.end(),
                  [](const batch_timing& x, const batch_timing& y) { return x.seconds < y.seconds; });
        results.push_back({flops / per_call.front().seconds * 1e-9,
                           flops / per_call[per_call.size() / 2].seconds * 1e-9,
                           per_call.front().cpu_share});
    }
    return results;
}

struct cpu_description {
    std::string model = "unknown";
    std::string isa;
    double ghz = 0.0;
    double measured_ghz_one = 0.0;
    double measured_ghz_all = 0.0;
    int cores = 0;
    int flops_per_cycle = 0;
};

// Core clock from a chain of dependent 1-cycle integer adds. Needed because
// /proc/cpuinfo in a VM reports the TSC rate, not the boost clock GEMM runs at.
double measure_clock_ghz() {
#if defined(__x86_64__)
    constexpr long iterations = 20'000'000, adds_per_iteration = 10;
    double best = 0.0;
    for (int attempt = 0; attempt < 3; ++attempt) {
        long counter = iterations, value = 0;
        auto start = std::chrono::steady_clock::now();
        asm volatile(
            "1:\n\t"
            "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
            "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
            "dec %1\n\tjnz 1b"
            : "+r"(value), "+r"(counter));
        double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        best = std::max(best, double(iterations * adds_per_iteration) / seconds * 1e-9);
    }
    return best;
#else
    return 0.0;
#endif
}

// Theoretical peak inputs from /proc/cpuinfo: FLOPs/cycle/core assumes two
// FMA pipes (2 pipes x 2 flops x 8 fp32 lanes = 32 for AVX2, 64 for AVX-512);
// AVX-512 parts with a single 512-bit FMA pipe peak at half that.
cpu_description describe_cpu() {
    cpu_description cpu;
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line, flags;
    int siblings = 0, cpu_cores = 0;
    auto value_of = [](const std::string& text) {
        auto colon = text.find(':');
        if (colon == std::string::npos) return std::string();
        auto start = text.find_first_not_of(" \t", colon + 1);
        return start == std::string::npos ? std::string() : text.substr(start);
    };
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("model name", 0) == 0 && cpu.model == "unknown") cpu.model = value_of(line);
        else if (line.rfind("cpu MHz", 0) == 0 && cpu.ghz == 0.0) cpu.ghz = std::atof(value_of(line).c_str()) / 1000.0;
        else if (line.rfind("flags", 0) == 0 && flags.empty()) flags = " " + value_of(line) + " ";
        else if (line.rfind("siblings", 0) == 0 && siblings == 0) siblings = std::atoi(value_of(line).c_str());
        else if (line.rfind("cpu cores", 0) == 0 && cpu_cores == 0) cpu_cores = std::atoi(value_of(line).c_str());
    }
    // Prefer the advertised maximum frequency where cpufreq exposes it (not in most VMs).
    std::ifstream max_freq("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
    if (double khz = 0; max_freq >> khz && khz > 0) cpu.ghz = khz / 1e6;
    int threads_per_core = (siblings > 0 && cpu_cores > 0) ? std::max(1, siblings / cpu_cores) : 1;
    cpu.cores = std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)) / threads_per_core);
    auto has = [&](const char* flag) { return flags.find(" " + std::string(flag) + " ") != std::string::npos; };
    cpu.isa = std::string("AVX2 ") + (has("avx2") ? "yes" : "no") + ", FMA " +
              (has("fma") ? "yes" : "no") + ", AVX-512F " + (has("avx512f") ? "yes" : "no");
    if (has("avx512f")) cpu.flops_per_cycle = 64;
    else if (has("avx2") && has("fma")) cpu.flops_per_cycle = 32;
    else if (has("avx")) cpu.flops_per_cycle = 16;
    else cpu.flops_per_cycle = 8;
    cpu.measured_ghz_one = measure_clock_ghz();
    // All cores busy at once: the all-core clock is usually lower than the 1-core boost.
    double slowest = 1e9;
#pragma omp parallel num_threads(cpu.cores) reduction(min : slowest)
    slowest = measure_clock_ghz();
    cpu.measured_ghz_all = slowest;
    return cpu;
}

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

}  // namespace

int main(int argc, char** argv) {
    std::vector<int> thread_counts = {1, 2};
    std::vector<std::string> library_names = {"openblas", "blis", "onednn"};
    double batch_seconds = 0.1;
    int timings = 5;
    double max_case_seconds = 12.0;
    model_shape shape;
    for (int i = 1; i < argc; ++i) {
        std::string_view argument = argv[i];
        auto value_after = [&](std::string_view prefix) -> std::string_view {
            return argument.rfind(prefix, 0) == 0 ? argument.substr(prefix.size()) : std::string_view();
        };
        if (argument == "--help") {
            print_usage();
            return 0;
        } else if (auto value = value_after("--threads="); !value.empty()) {
            thread_counts.clear();
            for (const auto& item : split_list(value)) thread_counts.push_back(std::atoi(item.c_str()));
        } else if (auto value = value_after("--libraries="); !value.empty()) {
            library_names = split_list(value);
        } else if (auto value = value_after("--openblas-coretype="); !value.empty()) {
            // Must precede dlopen: OpenBLAS picks its kernels in a load-time constructor.
            setenv("OPENBLAS_CORETYPE", std::string(value).c_str(), 1);
        } else if (auto value = value_after("--batch-seconds="); !value.empty()) {
            batch_seconds = std::atof(std::string(value).c_str());
        } else if (auto value = value_after("--max-case-seconds="); !value.empty()) {
            max_case_seconds = std::atof(std::string(value).c_str());
        } else if (auto value = value_after("--model="); !value.empty()) {
            const auto dims = split_list(value);
            if (dims.size() != 3) fail("--model=D_MODEL,D_FF,TOKENS expects 3 numbers");
            shape = {std::atol(dims[0].c_str()), std::atol(dims[1].c_str()), std::atol(dims[2].c_str())};
            if (shape.d_model < 1 || shape.d_ff < 1 || shape.tokens < 1)
                fail("--model values must be positive");
        } else if (auto value = value_after("--timings="); !value.empty()) {
            timings = std::max(1, std::atoi(std::string(value).c_str()));
        } else {
            print_usage();
            fail("unknown argument " + std::string(argument));
        }
    }
    for (int threads : thread_counts)
        if (threads < 1) fail("thread counts must be positive");

    std::vector<blas_library> libraries;
    for (const auto& name : library_names) {
        if (name == "openblas") libraries.push_back(load_openblas());
        else if (name == "blis") libraries.push_back(load_blis());
        else if (name == "onednn") libraries.push_back(load_onednn());
        else fail("unknown library " + name + " (expected openblas, blis, onednn)");
    }

    cpu_description cpu = describe_cpu();
    std::printf("# SGEMM benchmark\n\n");
    std::printf("CPU: %s; %d cores; %.3f GHz; %s\n", cpu.model.c_str(), cpu.cores, cpu.ghz,
                cpu.isa.c_str());
    std::printf("Theoretical fp32 peak: %d cores x %.3f GHz x %d FLOP/cycle = %.1f GFLOP/s "
                "(%.1f GFLOP/s per core)\n",
                cpu.cores, cpu.ghz, cpu.flops_per_cycle, cpu.cores * cpu.ghz * cpu.flops_per_cycle,
                cpu.ghz * cpu.flops_per_cycle);
    if (cpu.measured_ghz_all < 0.85 * cpu.measured_ghz_one) {
        // A thread that got descheduled reads as a slow clock; do not trust it.
        std::printf("All-core clock read %.2f GHz, likely other load on the host; using the "
                    "1-core clock instead\n", cpu.measured_ghz_all);
        cpu.measured_ghz_all = cpu.measured_ghz_one;
    }
    std::printf("Measured core clock (dependent-add loop): %.2f GHz with 1 core busy, %.2f GHz "
                "with %d busy; peak at that clock: %.1f GFLOP/s (1 core), %.1f GFLOP/s (%d cores)\n\n",
                cpu.measured_ghz_one, cpu.measured_ghz_all, cpu.cores,
                cpu.measured_ghz_one * cpu.flops_per_cycle,
                cpu.cores * cpu.measured_ghz_all * cpu.flops_per_cycle, cpu.cores);
    for (const auto& library : libraries)
        std::printf("- %s: %s; %s\n", library.name.c_str(), library.path.c_str(),
                    library.kernel_info.c_str());
    std::printf("\n");

    for (const auto& library : libraries)
        for (int threads : thread_counts) check_correctness(library, threads);
    std::printf("Correctness: all libraries match a double reference on 67x45x33, "
                "NN/NT/TN/TT, padded ld, beta != 0.\n\n");

    std::vector<gemm_case> cases = transformer_cases(shape);
    size_t largest = 0;
    for (const auto& shape : cases)
        largest = std::max({largest, size_t(shape.m * shape.k), size_t(shape.k * shape.n),
                            size_t(shape.m * shape.n)});
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

    // results[case][library * thread_counts + thread index]
    std::vector<std::vector<measurement>> results(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
        results[i].resize(libraries.size() * thread_counts.size());
        for (size_t t = 0; t < thread_counts.size(); ++t) {
            auto per_library = time_case(libraries, cases[i], thread_counts[t], a.get(), b.get(),
                                         c.get(), batch_seconds, timings, max_case_seconds);
            for (size_t l = 0; l < libraries.size(); ++l) {
                results[i][l * thread_counts.size() + t] = per_library[l];
                std::fprintf(stderr, "%-34s %-8s %dT best %6.1f median %6.1f GFLOP/s cpu share %.2f\n",
                             cases[i].label.c_str(), libraries[l].name.c_str(), thread_counts[t],
                             per_library[l].best_gflops, per_library[l].median_gflops,
                             per_library[l].best_cpu_share);
            }
        }
    }
    auto print_table = [&](const char* title, bool best) {
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
                            best && result.best_cpu_share < contended_share ? "*" : "");
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
    };
    print_table("## GFLOP/s, best batch", true);
    bool any_contended = false;
    for (const auto& row : results)
        for (const auto& result : row) any_contended |= result.best_cpu_share < contended_share;
    if (any_contended)
        std::printf("\\* no batch got >= %.0f%% of its threads' CPU time within "
                    "--max-case-seconds (other load on the host); the number is from contended "
                    "batches.\n\n",
                    100.0 * contended_share);
    print_table("## GFLOP/s, median batch", false);
    return 0;
}
