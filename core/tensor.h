// Tensor: a shape, a dtype, a device and a ref-counted, 64-byte-aligned contiguous storage.
// Invariant: every tensor is contiguous (row-major); views exist only where they are free
// (reshape shares storage). Autograd state lives beside the data in the same impl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace mod {

enum class DType : uint8_t { F32, F64, I32, I64, BF16 };
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
const char* device_name(Device d);
bool is_floating(DType t);  // F32, F64, BF16
bool is_index(DType t);     // I32, I64

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& s);

// Owns one aligned allocation on one device. Freed when the last tensor using it goes.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // A stamp from one program-wide counter, taken at allocation and again at every write the
  // tensor layer is told of (copy_from, set, optimizer updates): a copy made at stamp s is of
  // the current values while stamp() == s (weight copies, core/weight_copy.h).
  uint64_t stamp() const { return stamp_; }
  void mark_written();
  // Frees the bytes and allocates `bytes` anew (contents undefined, stamped as written); every
  // tensor on this storage sees the new bytes. ZeRO-3 shrinks a parameter's storage to 0 between
  // its unit's uses and grows it back when gathered (parallel/zero3.h), as FSDP resizes storage.
  void resize(size_t bytes);
  // What the bytes hold, said by a read that finds them released (a ZeRO-3 parameter's name).
  void set_label(std::string label) { label_ = std::move(label); }
  const std::string& label() const { return label_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  uint64_t stamp_;
  std::string label_;
};

struct Node;
struct TensorImpl;
struct WeightCopy;

class Tensor {
 public:
  Tensor() = default;  // undefined tensor: defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialised memory; use zeros()/full() when the contents matter.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = Device::CPU);
  // Copies host values (converted to dtype) into a new CPU tensor.
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                            DType dtype = DType::F32);
  static Tensor from_indices(const std::vector<int64_t>& values, const Shape& shape,
                             DType dtype = DType::I64);
  static Tensor scalar(double value, DType dtype = DType::F32);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t axis) const;  // negative axis counts from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }

  void* raw_data() const;
  template <typename T>
  T* data() const { return static_cast<T*>(raw_data()); }

  // Element read/write as double; for tests, metrics and small host logic. at() and set() are
  // CPU only; item() and to_vector() copy a device tensor to the host (and so wait for it).
  double item() const;  // numel() must be 1
  double at(int64_t flat_index) const;
  void set(int64_t flat_index, double value);
  std::vector<double> to_vector() const;

  // A new tensor with its own storage, same values; no autograd history.
  Tensor clone() const;
  // Same values converted to another float dtype (f32 <-> f64); no autograd history.
  Tensor to(DType dtype) const;
  // Same values on another device (a copy; this tensor itself when already there); no autograd
  // history. Copies to the host wait for the device.
  Tensor to(Device device) const;
  // Moves this tensor's values to another device in place: every handle sharing it (a module's
  // parameter, the optimizer's list) sees the new storage. Not for views.
  void move_to(Device device);
  // Shares storage; no autograd history (the differentiable reshape is mod::reshape).
  Tensor view(const Shape& shape) const;
  // Shares storage: rows [start, start + length) along dim 0; no autograd history.
  Tensor narrow0(int64_t start, int64_t length) const;
  // Copies values from src (same numel and dtype, either device) into this tensor's storage.
  void copy_from(const Tensor& src);

  // --- autograd ---
  bool requires_grad() const;
  Tensor& set_requires_grad(bool value);
  const Tensor& grad() const;  // undefined until backward() has reached this leaf
  void zero_grad();            // drops the accumulated gradient
  std::shared_ptr<Node> grad_fn() const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  // Backpropagates from this tensor. A non-scalar needs seed (same shape); see autograd.h.
  void backward(const Tensor& seed = Tensor()) const;

  TensorImpl* impl() const { return impl_.get(); }
  // No other handle, view or tensor shares this one's data, and it spans all of its storage.
  bool sole_owner() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  Shape shape;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  std::shared_ptr<Storage> storage;
  size_t offset_bytes = 0;  // views share storage at an offset
  // autograd
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  // A parameter's lower-precision copy kept by its optimizer (core/weight_copy.h), or null.
  std::shared_ptr<WeightCopy> weight_copy;
};

std::string describe(const Tensor& t);  // "f32[2, 3] on cpu"

}  // namespace mod
