// Tensor and Storage implementation: allocation, host element access, copies and views.
#include "core/tensor.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "core/autograd.h"
#include "core/backend.h"

namespace mod {

namespace {
uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}
float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  return std::string(dtype_name(t.dtype())) + shape_str(t.shape()) + " on " +
         device_name(t.device());
}

namespace {
std::atomic<uint64_t> g_next_stamp{1};
}  // namespace

Storage::Storage(size_t bytes, Device device)
    : bytes_(bytes), device_(device), stamp_(g_next_stamp.fetch_add(1)) {
  data_ = backend(device).allocate(bytes);  // 64-byte aligned on every backend
}

void Storage::mark_written() { stamp_ = g_next_stamp.fetch_add(1); }

void Storage::resize(size_t bytes) {
  if (bytes == bytes_) return;
  backend(device_).deallocate(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
  data_ = backend(device_).allocate(bytes);
  bytes_ = bytes;
  mark_written();
}

Storage::~Storage() { backend(device_).deallocate(data_, bytes_); }

bool Tensor::sole_owner() const {
  return impl_ && impl_.use_count() == 1 && impl_->storage && impl_->storage.use_count() == 1 &&
         impl_->offset_bytes == 0 && impl_->storage->bytes() == nbytes();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->device = device;
  impl->storage = std::make_shared<Storage>(shape_numel(shape) * dtype_size(dtype), device);
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  backend(device).fill(t, 0.0);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  backend(device).fill(t, value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype) {
  if (static_cast<int64_t>(values.size()) != shape_numel(shape))
    throw std::invalid_argument("from_vector: " + std::to_string(values.size()) +
                                " values for shape " + shape_str(shape));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), values[i]);
  return t;
}

Tensor Tensor::from_indices(const std::vector<int64_t>& values, const Shape& shape,
                            DType dtype) {
  if (!is_index(dtype)) throw std::invalid_argument("from_indices: dtype must be i32 or i64");
  if (static_cast<int64_t>(values.size()) != shape_numel(shape))
    throw std::invalid_argument("from_indices: " + std::to_string(values.size()) +
                                " values for shape " + shape_str(shape));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::I32)
      t.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
    else
      t.data<int64_t>()[i] = values[i];
  }
  return t;
}

Tensor Tensor::scalar(double value, DType dtype) { return from_vector({value}, {}, dtype); }

const Shape& Tensor::shape() const {
  if (!impl_) throw std::logic_error("shape() of an undefined tensor");
  return impl_->shape;
}

int64_t Tensor::size(int64_t axis) const {
  int64_t n = dim();
  int64_t a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n)
    throw std::out_of_range("size(" + std::to_string(axis) + ") of " + describe(*this));
  return shape()[a];
}

int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const { return impl_->dtype; }
Device Tensor::device() const { return impl_->device; }

void* Tensor::raw_data() const {
  if (!impl_) throw std::logic_error("data() of an undefined tensor");
  // A storage without the tensor's bytes: a ZeRO-3 parameter outside its unit (parallel/zero3.h).
  if (!impl_->storage || impl_->storage->bytes() < impl_->offset_bytes + nbytes())
    throw std::logic_error("data() of " + describe(*this) +
                           (impl_->storage && !impl_->storage->label().empty()
                                ? " (" + impl_->storage->label() + ")" : "") +
                           " whose storage is released");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset_bytes;
}

double Tensor::at(int64_t i) const {
  if (device() != Device::CPU) throw std::logic_error("at(): tensor is on " + describe(*this));
  if (i < 0 || i >= numel())
    throw std::out_of_range("at(" + std::to_string(i) + ") of " + describe(*this));
  switch (dtype()) {
    case DType::F32: return data<float>()[i];
    case DType::F64: return data<double>()[i];
    case DType::I32: return data<int32_t>()[i];
    case DType::I64: return static_cast<double>(data<int64_t>()[i]);
    case DType::BF16: return bf16_to_float(data<uint16_t>()[i]);
  }
  return 0.0;
}

void Tensor::set(int64_t i, double v) {
  if (device() != Device::CPU) throw std::logic_error("set(): tensor is on " + describe(*this));
  if (i < 0 || i >= numel())
    throw std::out_of_range("set(" + std::to_string(i) + ") of " + describe(*this));
  switch (dtype()) {
    case DType::F32: data<float>()[i] = static_cast<float>(v); break;
    case DType::F64: data<double>()[i] = v; break;
    case DType::I32: data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::I64: data<int64_t>()[i] = static_cast<int64_t>(v); break;
    case DType::BF16: data<uint16_t>()[i] = float_to_bf16(static_cast<float>(v)); break;
  }
  impl_->storage->mark_written();
}

double Tensor::item() const {
  if (numel() != 1) throw std::logic_error("item() of " + describe(*this) + ": needs one element");
  return device() == Device::CPU ? at(0) : to(Device::CPU).at(0);
}

std::vector<double> Tensor::to_vector() const {
  if (device() != Device::CPU) return to(Device::CPU).to_vector();
  // One loop over the raw data: at() per element (checks and a dtype switch each) is too slow
  // for the router scores a MoD block reports every step.
  std::vector<double> out(static_cast<size_t>(numel()));
  auto widen = [&out](const auto* p, auto f) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = f(p[i]);
  };
  auto cast = [](auto v) { return static_cast<double>(v); };
  switch (dtype()) {
    case DType::F32: widen(data<float>(), cast); break;
    case DType::F64: widen(data<double>(), cast); break;
    case DType::I32: widen(data<int32_t>(), cast); break;
    case DType::I64: widen(data<int64_t>(), cast); break;
    case DType::BF16:
      widen(data<uint16_t>(), [](uint16_t v) { return static_cast<double>(bf16_to_float(v)); });
      break;
  }
  return out;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype(), device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return clone();
  Tensor t = empty(shape(), target, device());
  backend(device()).convert(*this, t);
  return t;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor t = empty(shape(), dtype(), target);
  t.copy_from(*this);
  return t;
}

void Tensor::move_to(Device target) {
  if (target == device()) return;
  if (impl_->offset_bytes != 0 || impl_->storage->bytes() != nbytes())
    throw std::logic_error("move_to: " + describe(*this) + " is a view");
  const Tensor moved = to(target);
  impl_->storage = moved.impl_->storage;
  impl_->device = target;
}

Tensor Tensor::view(const Shape& new_shape) const {
  if (shape_numel(new_shape) != numel())
    throw std::invalid_argument("view: cannot view " + describe(*this) + " as " +
                                shape_str(new_shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = new_shape;
  impl->dtype = dtype();
  impl->device = device();
  impl->storage = impl_->storage;
  impl->offset_bytes = impl_->offset_bytes;
  return Tensor(std::move(impl));
}

Tensor Tensor::narrow0(int64_t start, int64_t length) const {
  if (dim() < 1 || start < 0 || length < 0 || start + length > size(0))
    throw std::out_of_range("narrow0(" + std::to_string(start) + ", " + std::to_string(length) +
                            ") of " + describe(*this));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape();
  impl->shape[0] = length;
  impl->dtype = dtype();
  impl->device = device();
  impl->storage = impl_->storage;
  const int64_t row = shape_numel(Shape(shape().begin() + 1, shape().end()));
  impl->offset_bytes = impl_->offset_bytes + static_cast<size_t>(start * row) * dtype_size(dtype());
  return Tensor(std::move(impl));
}

void Tensor::copy_from(const Tensor& src) {
  if (src.numel() != numel() || src.dtype() != dtype())
    throw std::invalid_argument("copy_from: " + describe(src) + " into " + describe(*this));
  // A copy that touches the GPU is the GPU backend's (it knows both kinds of memory).
  const Device via = src.device() == Device::CPU ? device() : src.device();
  backend(via).copy(src, *this);
  impl_->storage->mark_written();
}

bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }

Tensor& Tensor::set_requires_grad(bool value) {
  if (value && !is_floating(dtype()))
    throw std::invalid_argument("set_requires_grad: " + describe(*this) + " is not floating");
  impl_->requires_grad = value;
  return *this;
}

const Tensor& Tensor::grad() const { return impl_->grad; }
void Tensor::zero_grad() { impl_->grad = Tensor(); }
std::shared_ptr<Node> Tensor::grad_fn() const { return impl_ ? impl_->grad_fn : nullptr; }

void Tensor::backward(const Tensor& seed) const { mod::backward(*this, seed); }

}  // namespace mod
