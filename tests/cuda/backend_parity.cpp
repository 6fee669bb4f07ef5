// The CUDA-against-CPU harness (backend_parity.h): argument conversion per precision, the two
// runs, and comparisons that name the worst element.
#include "tests/cuda/backend_parity.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <cmath>
#include <exception>
#include <limits>
#include <sstream>
#include <utility>

namespace mod::parity {

namespace {

// "[1, 0, 7]" for flat index i of shape s.
std::string index_str(const Shape& s, int64_t flat) {
  std::vector<int64_t> idx(s.size(), 0);
  for (size_t d = s.size(); d-- > 0;) {
    if (s[d] == 0) break;
    idx[d] = flat % s[d];
    flat /= s[d];
  }
  return shape_str(idx);
}

bool same_value(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// f32 CPU tensor with a CPU bf16 tensor's values (exact).
Tensor widen_bf16(const Tensor& host_bf16) {
  Tensor f = Tensor::empty(host_bf16.shape(), DType::F32);
  for (int64_t i = 0; i < f.numel(); ++i) f.set(i, host_bf16.at(i));
  return f;
}

}  // namespace

Precision precision(DType dtype) {
  switch (dtype) {
    case DType::F64: return {DType::F64, DType::F64, 1e-12, 1e-10};
    case DType::F32: return {DType::F32, DType::F32, 1e-5, 1e-4};
    case DType::BF16: return {DType::BF16, DType::F32, 2e-2, 2e-2};
    default: break;
  }
  throw std::invalid_argument(std::string("parity: no precision for ") + dtype_name(dtype));
}

Arg in(std::string name, Tensor value) {
  return {std::move(name), Arg::Role::In, std::move(value)};
}

Arg inout(std::string name, Tensor value) {
  return {std::move(name), Arg::Role::InOut, std::move(value)};
}

Arg out(std::string name, const Shape& shape, DType dtype) {
  const double poison = is_index(dtype) ? -1.0 : std::numeric_limits<double>::quiet_NaN();
  return {std::move(name), Arg::Role::Out, Tensor::full(shape, poison, dtype)};
}

Arg f32_when_bf16(Arg a) {
  a.f32_when_bf16 = true;
  return a;
}

Backend& cpu() { return backend(Device::CPU); }
Backend& gpu() { return backend(Device::CUDA); }

Tensor normal(const Shape& shape, Rng& rng, double std, double mean) {
  return randn(shape, rng, DType::F64, std, mean);
}

Tensor uniform(const Shape& shape, Rng& rng, double lo, double hi) {
  return rand_uniform(shape, rng, DType::F64, lo, hi);
}

Tensor rounded(const Tensor& master, DType dtype) {
  Tensor out = Tensor::empty(master.shape(), DType::F64);
  Tensor one = Tensor::empty({1}, dtype);  // set() rounds to dtype, at() reads it back
  for (int64_t i = 0; i < master.numel(); ++i) {
    one.set(0, master.at(i));
    out.set(i, one.at(0));
  }
  return out;
}

Tensor to_gpu(const Tensor& master, DType dtype) {
  if (dtype != DType::BF16) return master.to(dtype).to(Device::CUDA);
  const Tensor f32 = master.to(DType::F32).to(Device::CUDA);
  Tensor b = Tensor::empty(master.shape(), DType::BF16, Device::CUDA);
  gpu().convert(f32, b);
  return b;
}

Tensor indices(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  return Tensor::from_indices(values, shape, dtype);
}

std::vector<int64_t> iota(int64_t n, int64_t start) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + i;
  return v;
}

std::vector<int64_t> sorted_subset(int64_t n, int64_t limit, Rng& rng) {
  std::vector<int64_t> all = iota(limit);
  for (int64_t i = 0; i < n; ++i)  // partial Fisher-Yates
    std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(i + rng.below(limit - i))]);
  all.resize(static_cast<size_t>(n));
  std::sort(all.begin(), all.end());
  return all;
}

int64_t offset_bytes(DType dtype) {
  static const int64_t bytes = [] {
    const char* v = std::getenv("MOD_PARITY_OFFSET_BYTES");
    return v && *v ? std::stoll(v) : int64_t{0};
  }();
  const int64_t size = static_cast<int64_t>(dtype_size(dtype));
  return (bytes + size - 1) / size * size;
}

namespace {
Tensor at_offset(const Tensor& g) {
  const int64_t k = offset_bytes(g.dtype()) / static_cast<int64_t>(dtype_size(g.dtype()));
  if (k == 0) return g;
  Tensor big = Tensor::empty({g.numel() + k}, g.dtype(), Device::CUDA);
  Tensor view = big.narrow0(k, g.numel()).view(g.shape());
  view.copy_from(g);
  return view;
}
}  // namespace

void check_parity(const Precision& p, const std::vector<Arg>& args, const Call& call, Tol tol,
                  double scale_floor) {
  INFO("dtype " << dtype_name(p.dtype) << " (CPU reference in " << dtype_name(p.cpu_dtype)
                << ")");
  std::vector<Tensor> cpu_args, gpu_args, gpu_before;
  for (const Arg& a : args) {
    if (is_index(a.value.dtype())) {
      cpu_args.push_back(a.value.clone());
      gpu_args.push_back(at_offset(a.value.to(Device::CUDA)));
    } else {
      const DType dtype = a.f32_when_bf16 && p.dtype == DType::BF16 ? DType::F32 : p.dtype;
      Tensor g = to_gpu(a.value, dtype);
      // The CPU sees exactly the values the GPU holds: bf16 ones read back and widened.
      cpu_args.push_back(dtype == DType::BF16 ? widen_bf16(g.to(Device::CPU))
                                              : a.value.to(p.cpu_dtype));
      gpu_args.push_back(at_offset(g));
    }
    gpu_before.push_back(gpu_args.back().to(Device::CPU));
  }

  call(cpu(), cpu_args);
  try {
    call(gpu(), gpu_args);
    for (size_t i = 0; i < args.size(); ++i) {
      const Arg& a = args[i];
      const Tensor got = gpu_args[i].to(Device::CPU);  // waits for the kernels
      if (a.role == Arg::Role::In) {
        expect_equal(a.name + " (an input: the GPU must not write it)", got, gpu_before[i]);
      } else if (is_index(got.dtype())) {
        expect_equal(a.name, got, cpu_args[i]);
      } else {
        expect_close(a.name, got, cpu_args[i], p.tolerance(tol), scale_floor);
      }
    }
  } catch (const std::exception& e) {
    FAIL_CHECK("the CUDA backend threw: " << e.what());
  }
}

void expect_close(const std::string& what, const Tensor& got, const Tensor& want, double rtol,
                  double scale_floor) {
  REQUIRE(got.numel() == want.numel());
  const int64_t n = want.numel();
  double ss = 0.0;
  int64_t finite = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = want.at(i);
    if (std::isfinite(w)) {
      ss += w * w;
      ++finite;
    }
  }
  const double scale =
      std::max(scale_floor, finite > 0 ? std::sqrt(ss / static_cast<double>(finite)) : 0.0);
  const double inf = std::numeric_limits<double>::infinity();
  // ratio: |diff| in units of the element's allowance; > 1 fails.
  double worst = -1.0;
  int64_t worst_i = -1, bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got.at(i), w = want.at(i);
    double ratio;
    if (!std::isfinite(w))
      ratio = same_value(g, w) ? 0.0 : inf;
    else if (!std::isfinite(g))
      ratio = inf;
    else {
      const double allowed = rtol * (std::abs(w) + scale);
      ratio = g == w ? 0.0 : (allowed > 0.0 ? std::abs(g - w) / allowed : inf);
    }
    if (ratio > 1.0) ++bad;
    if (ratio > worst) {
      worst = ratio;
      worst_i = i;
    }
  }
  std::ostringstream msg;
  msg.precision(15);
  msg << what << " " << shape_str(want.shape()) << " (GPU " << dtype_name(got.dtype()) << ", CPU "
      << dtype_name(want.dtype()) << "): " << bad << " of " << n << " elements outside rtol "
      << rtol << " (scale: rms " << scale << ")";
  if (worst_i >= 0) {
    const double g = got.at(worst_i), w = want.at(worst_i);
    msg << "; worst at " << index_str(want.shape(), worst_i) << " (flat " << worst_i
        << "): gpu " << g << ", cpu " << w << ", |diff| " << std::abs(g - w) << " = " << worst
        << " x the allowance";
  }
  INFO(msg.str());
  CHECK(bad == 0);
}

void expect_equal(const std::string& what, const Tensor& got, const Tensor& want) {
  REQUIRE(got.numel() == want.numel());
  int64_t first = -1, bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    if (!same_value(got.at(i), want.at(i))) {
      if (first < 0) first = i;
      ++bad;
    }
  std::ostringstream msg;
  msg.precision(17);
  msg << what << " " << shape_str(want.shape()) << " (GPU " << dtype_name(got.dtype()) << ", CPU "
      << dtype_name(want.dtype()) << "): " << bad << " of " << want.numel() << " elements differ";
  if (first >= 0)
    msg << "; first at " << index_str(want.shape(), first) << " (flat " << first << "): gpu "
        << got.at(first) << ", cpu " << want.at(first);
  INFO(msg.str());
  CHECK(bad == 0);
}

}  // namespace mod::parity
