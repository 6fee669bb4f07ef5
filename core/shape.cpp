// dtype and shape helpers declared in core/tensor.h that need no backend, so the file readers'
// fuzz build (tests/fuzz/) links them without the CPU kernels. shape_numel never overflows.
#include <sstream>
#include <stdexcept>

#include "core/tensor.h"

namespace mod {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::BF16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::BF16: return "bf16";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }
bool is_floating(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::BF16; }
bool is_index(DType t) { return t == DType::I32 || t == DType::I64; }

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape " + shape_str(s));
    // Shapes arrive from files (checkpoints, safetensors): an overflowing product is an error.
    if (__builtin_mul_overflow(n, d, &n))
      throw std::invalid_argument("shape " + shape_str(s) + " has more than 2^63 elements");
  }
  return n;
}

}  // namespace mod
