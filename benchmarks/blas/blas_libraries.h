// blas_sgemm's libraries: OpenBLAS, BLIS and oneDNN, each loaded at run time with dlopen (never
// linked, so their identically named cblas_sgemm symbols cannot clash) behind one row-major
// sgemm call. Function types follow each library's ABI; docs/blas.md lists the symbols.
#pragma once

#include <string>

namespace mod::blas_bench {

// Prints "error: <message>" and exits 1.
[[noreturn]] void fail(const std::string& message);

// 32-bit integer CBLAS, as shipped by Debian's OpenBLAS and BLIS packages.
using cblas_sgemm_fn = void (*)(int order, int transa, int transb, int m, int n, int k, float alpha,
                                const float* a, int lda, const float* b, int ldb, float beta,
                                float* c, int ldc);
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

enum class LibraryKind { openblas, blis, onednn };

// One dlopen'ed BLAS with a uniform row-major sgemm entry point.
struct BlasLibrary {
  LibraryKind kind;
  std::string name;
  std::string path;
  std::string kernel_info;
  cblas_sgemm_fn cblas_sgemm = nullptr;
  dnnl_sgemm_fn dnnl_sgemm = nullptr;
  openblas_set_num_threads_fn openblas_set_num_threads = nullptr;
  bli_thread_set_num_threads_fn bli_thread_set_num_threads = nullptr;

  void set_threads(int threads) const;

  void sgemm(char transa, char transb, long m, long n, long k, float alpha, const float* a,
             long lda, const float* b, long ldb, float beta, float* c, long ldc) const;
};

// "openblas", "blis" or "onednn", loaded with its kernel report; fails on any other name.
BlasLibrary load_library(const std::string& name);

}  // namespace mod::blas_bench
