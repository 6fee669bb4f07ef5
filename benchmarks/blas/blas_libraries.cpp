// Loading the BLAS libraries with dlopen and calling them (blas_libraries.h).
#include "benchmarks/blas/blas_libraries.h"

#include <dlfcn.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace mod::blas_bench {

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::exit(1);
}

namespace {

// CBLAS enum values; fixed by the CBLAS standard, so no header is needed.
constexpr int cblas_row_major = 101;
constexpr int cblas_no_trans = 111;
constexpr int cblas_trans = 112;

struct dnnl_version_t {
  int major;
  int minor;
  int patch;
  const char* hash;
  unsigned cpu_runtime;
  unsigned gpu_runtime;
};
using dnnl_version_fn = const dnnl_version_t* (*)();

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
    case 0x0:
      return "all";
    case 0x1:
      return "sse41";
    case 0x3:
      return "avx";
    case 0x7:
      return "avx2";
    case 0xf:
      return "avx512_mic";
    case 0x1f:
      return "avx512_mic_4ops";
    case 0x27:
      return "avx512_core";
    case 0x67:
      return "avx512_core_vnni";
    case 0xe7:
      return "avx512_core_bf16";
    case 0x3e7:
      return "avx512_core_amx";
    case 0x407:
      return "avx2_vnni";
    default: {
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "isa 0x%x", isa);
      return buffer;
    }
  }
}

BlasLibrary load_openblas() {
  BlasLibrary library{LibraryKind::openblas, "OpenBLAS", "", ""};
  void* handle =
      load_first({"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0", "libopenblas.so.0"},
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

BlasLibrary load_blis() {
  BlasLibrary library{LibraryKind::blis, "BLIS", "", ""};
  void* handle = load_first({"/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4", "libblis.so.4"},
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

BlasLibrary load_onednn() {
  BlasLibrary library{LibraryKind::onednn, "oneDNN", "", ""};
  void* handle = load_first(
      {"libdnnl.so.2", "/usr/lib/x86_64-linux-gnu/libdnnl.so.2", "libdnnl.so.3"}, library.path);
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

}  // namespace

void BlasLibrary::set_threads(int threads) const {
  // All three link the same libgomp as this binary. oneDNN and OpenBLAS's
  // OpenMP build take their thread count from the OpenMP ICV at call time
  // (openblas_set_num_threads rewrites that ICV, so the last call wins);
  // BLIS ignores the ICV and defaults to 1 thread without its own setter.
  omp_set_num_threads(threads);
  if (openblas_set_num_threads) openblas_set_num_threads(threads);
  if (bli_thread_set_num_threads) bli_thread_set_num_threads(threads);
}

void BlasLibrary::sgemm(char transa, char transb, long m, long n, long k, float alpha,
                        const float* a, long lda, const float* b, long ldb, float beta, float* c,
                        long ldc) const {
  if (dnnl_sgemm) {
    int status = dnnl_sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    if (status != 0) fail("dnnl_sgemm returned status " + std::to_string(status));
    return;
  }
  cblas_sgemm(cblas_row_major, transa == 'T' ? cblas_trans : cblas_no_trans,
              transb == 'T' ? cblas_trans : cblas_no_trans, int(m), int(n), int(k), alpha, a,
              int(lda), b, int(ldb), beta, c, int(ldc));
}

BlasLibrary load_library(const std::string& name) {
  if (name == "openblas") return load_openblas();
  if (name == "blis") return load_blis();
  if (name == "onednn") return load_onednn();
  fail("unknown library " + name + " (expected openblas, blis, onednn)");
}

}  // namespace mod::blas_bench
