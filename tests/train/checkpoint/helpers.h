// Shared pieces of the checkpoint tests: a scratch run directory, deterministic tensors, a
// slice taken element by element (independent of the library's box copy), bitwise comparison.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/tensor.h"
#include "train/checkpoint/checkpoint.h"

namespace mod::test {

namespace fs = std::filesystem;

// A fresh directory under the temp dir, removed at the end of the scope.
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& label) {
    static std::atomic<int> counter{0};
    path =
        fs::temp_directory_path() / ("modtrain_ckpt_" + label + "_" + std::to_string(::getpid()) +
                                     "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// Values start, start + 1/8, ... (integers: start, start + 1, ...; bf16: raw bit patterns).
inline Tensor counting(const Shape& shape, DType dtype = DType::F32, double start = 0) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::BF16)
      t.data<uint16_t>()[i] = static_cast<uint16_t>(0x3f80 + i + static_cast<int64_t>(start));
    else
      t.set(i, start + static_cast<double>(i) / (is_index(dtype) ? 1 : 8));
  }
  return t;
}

// t[..., offset : offset + length, ...] along dim, copied one element at a time.
inline Tensor slice(const Tensor& t, int dim, int64_t offset, int64_t length) {
  Shape shape = t.shape();
  shape[dim] = length;
  Tensor out = Tensor::empty(shape, t.dtype());
  const size_t elem = dtype_size(t.dtype());
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t outer = out.numel() / (inner * length);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < length; ++i)
      for (int64_t k = 0; k < inner; ++k) {
        const int64_t src = (o * t.size(dim) + offset + i) * inner + k;
        const int64_t dst = (o * length + i) * inner + k;
        std::memcpy(static_cast<char*>(out.raw_data()) + dst * elem,
                    static_cast<const char*>(t.raw_data()) + src * elem, elem);
      }
  return out;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

inline std::string file_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

inline ckpt::TensorEntry whole(const std::string& name, const Tensor& t) {
  return {name, t, t.shape(), -1, 0, true};
}

// Piece k of n equal pieces of t along dim.
inline ckpt::TensorEntry piece(const std::string& name, const Tensor& t, int dim, int k, int n) {
  const int64_t len = t.size(dim) / n;
  return {name, slice(t, dim, k * len, len), t.shape(), dim, k * len, true};
}

inline ckpt::TrainState state_at(int64_t step) {
  ckpt::TrainState s;
  s.config.set_name("ckpt_test");
  s.config.mutable_model()->set_d_model(32);
  s.step = step;
  s.tokens_seen = step * 1024;
  s.loader_seed = 1337;
  s.batches_drawn = step * 2;
  s.rng_state = {1, 2, 3, static_cast<uint64_t>(step)};
  s.elapsed_seconds = 1.5 * static_cast<double>(step);
  s.last_metrics_step = step;
  s.optimizer_steps = step;
  return s;
}

}  // namespace mod::test
