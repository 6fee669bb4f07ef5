// Argument checks shared by the op wrappers; messages name the op, the argument and the shapes.
#include "core/ops/check.h"

#include <stdexcept>

namespace mod::check {

void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

void defined(const char* op, const Tensor& t, const char* arg) {
  if (!t.defined()) fail(op, std::string(arg) + " is an undefined tensor");
}

void floating(const char* op, const Tensor& t, const char* arg) {
  defined(op, t, arg);
  if (!is_floating(t.dtype()))
    fail(op, std::string(arg) + " must be f32, f64 or bf16, got " + describe(t));
}

void index(const char* op, const Tensor& t, const char* arg) {
  defined(op, t, arg);
  if (!is_index(t.dtype())) fail(op, std::string(arg) + " must be i32 or i64, got " + describe(t));
}

void dim(const char* op, const Tensor& t, int64_t expected, const char* arg) {
  if (t.dim() != expected)
    fail(op, std::string(arg) + " must have " + std::to_string(expected) + " dims, got " +
                 describe(t));
}

void same_shape(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                const char* b_name) {
  if (a.shape() != b.shape())
    fail(op, std::string(a_name) + " " + shape_str(a.shape()) + " and " + b_name + " " +
                 shape_str(b.shape()) + " must have the same shape");
}

void same_dtype_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                       const char* b_name) {
  if (a.dtype() != b.dtype() || a.device() != b.device())
    fail(op, std::string(a_name) + " is " + describe(a) + " but " + b_name + " is " +
                 describe(b) + ": dtype and device must match");
}

void same_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                 const char* b_name) {
  if (a.device() != b.device())
    fail(op, std::string(a_name) + " is " + describe(a) + " but " + b_name + " is " + describe(b) +
                 ": both must be on one device");
}

void indices_in_range(const char* op, const Tensor& idx, int64_t limit, const char* arg) {
  index(op, idx, arg);
  if (idx.device() != Device::CPU) return;  // device kernels check on the device
  const int64_t n = idx.numel();
  auto scan = [&](const auto* p) {
    for (int64_t i = 0; i < n; ++i) {
      if (p[i] < 0 || p[i] >= limit)
        fail(op, std::string(arg) + "[" + std::to_string(i) + "] = " + std::to_string(p[i]) +
                     " is out of range [0, " + std::to_string(limit) + ")");
    }
  };
  if (idx.dtype() == DType::I32)
    scan(idx.data<int32_t>());
  else
    scan(idx.data<int64_t>());
}

}  // namespace mod::check
