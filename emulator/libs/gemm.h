// The arithmetic behind the cuBLAS and cuBLASLt stand-ins (cublas.cpp, cublaslt.cpp): a
// column-major strided-batched GEMM, D = epilogue(alpha op(A) op(B) + beta C), on the host.
// Invariants: the product is accumulated in the compute type (f64 when every matrix is f64,
// else f32) in k order, bf16 inputs widened exactly; each output element is rounded to its type
// once (round to nearest even for bf16); C is not read when beta is 0 (cuBLAS guide,
// cublas<t>gemm: "if beta == 0, then C does not have to be a valid input"). No runtime calls:
// the callers check ranges and queue the work.
#pragma once

#include <cstddef>
#include <cstdint>

namespace emu::blas {

enum class Type { kF32, kF64, kBF16 };
size_t type_bytes(Type t);

// One column-major matrix operand of a batch: element (i, j) of batch b is at
// ptr[b * stride + i + j * ld] (in elements).
struct Matrix {
  const void* ptr = nullptr;
  Type type = Type::kF32;
  int64_t ld = 0;
  int64_t stride = 0;
};

// cuBLASLt's epilogues the backend uses (cuBLAS guide, cublasLtEpilogue_t). GELU is the tanh
// approximation. kGeluAux: aux = the pre-activation value, D = gelu(it); kDGelu: D = the value
// times gelu'(aux).
enum class Epilogue { kNone, kGeluAux, kDGelu };

struct Gemm {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false;
  Matrix a, b;  // op(A) is m x k, op(B) is k x n
  Matrix c;     // read when beta != 0; m x n
  Matrix d;     // written (cuBLAS: the same matrix as c); m x n; ptr cast to non-const
  double alpha = 1, beta = 0;
  Epilogue epilogue = Epilogue::kNone;
  Matrix aux;  // m x n: written by kGeluAux, read by kDGelu
};

// Runs g on the host. Types: all f32, all f64, or bf16 A and B with bf16 or f32 C and D (aux:
// f32 or bf16). The callers have refused every other combination.
void run(const Gemm& g);

// GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), and its
// derivative, in f64 so that an epilogue rounds once, to the output's type.
double gelu(double x);
double gelu_grad(double x);

}  // namespace emu::blas
