// Weight copies (see weight_copy.h).
#include "core/weight_copy.h"

#include <memory>
#include <stdexcept>

#include "core/backend.h"

namespace mod {

void keep_weight_copy(const Tensor& param, DType dtype) {
  if (!param.defined() || !is_floating(param.dtype()) || !is_floating(dtype))
    throw std::invalid_argument("keep_weight_copy: " + (param.defined() ? describe(param) : "undefined") +
                                " in " + dtype_name(dtype) + ": both must be floating");
  auto copy = std::make_shared<WeightCopy>();
  copy->dtype = dtype;
  param.impl()->weight_copy = std::move(copy);
}

void drop_weight_copy(const Tensor& param) {
  if (param.defined()) param.impl()->weight_copy.reset();
}

Tensor weight_copy_for(const Tensor& param, DType dtype) {
  if (!param.defined()) return Tensor();
  WeightCopy* copy = param.impl()->weight_copy.get();
  if (!copy || copy->dtype != dtype) return Tensor();
  const Storage& master = *param.impl()->storage;
  Tensor& value = copy->value;
  if (!value.defined() || value.device() != param.device() || value.shape() != param.shape()) {
    value = Tensor::empty(param.shape(), dtype, param.device());
    copy->stamp = 0;  // no storage has stamp 0
  }
  if (copy->stamp != master.stamp()) {
    backend_of(param).convert(param, value);
    copy->stamp = master.stamp();
  }
  return value;
}

Tensor allocated_weight_copy(const Tensor& param) {
  const WeightCopy* copy = param.defined() ? param.impl()->weight_copy.get() : nullptr;
  if (!copy || !copy->value.defined() || copy->value.device() != param.device() ||
      copy->value.shape() != param.shape())
    return Tensor();
  return copy->value;
}

Tensor weight_copy_to_write(const Tensor& param, DType dtype) {
  WeightCopy* copy = param.defined() ? param.impl()->weight_copy.get() : nullptr;
  if (!copy || copy->dtype != dtype)
    throw std::logic_error("weight_copy_to_write: " + describe(param) +
                           (param.defined() && !param.impl()->storage->label().empty()
                                ? " (" + param.impl()->storage->label() + ")" : "") +
                           " keeps no " + dtype_name(dtype) + " weight copy");
  Tensor& value = copy->value;
  if (!value.defined() || value.device() != param.device() || value.shape() != param.shape()) {
    value = Tensor::empty(param.shape(), dtype, param.device());
    copy->stamp = 0;  // no storage has stamp 0
  }
  return value;
}

void mark_copy_current(const Tensor& param) {
  if (WeightCopy* copy = param.impl()->weight_copy.get()) copy->stamp = param.impl()->storage->stamp();
}

void mark_written_with_copy(const Tensor& param) {
  Storage& master = *param.impl()->storage;
  master.mark_written();
  if (WeightCopy* copy = param.impl()->weight_copy.get()) copy->stamp = master.stamp();
}

}  // namespace mod
