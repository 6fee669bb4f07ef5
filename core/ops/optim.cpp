// adamw_update: validates, then one in-place backend pass. Outside autograd by design: it
// rewrites parameter storage and records nothing.
#include "core/ops/optim.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/ops/check.h"
#include "core/weight_copy.h"

namespace mod {

namespace {
constexpr const char* kOp = "adamw";

void like_param(const Tensor& param, const Tensor& t, const char* name) {
  check::floating(kOp, t, name);
  check::same_dtype_device(kOp, param, "param", t, name);
  check::same_shape(kOp, param, "param", t, name);
}
}  // namespace

std::array<double, kAdamWConstants> adamw_step_constants(const AdamWArgs& args) {
  const double step = static_cast<double>(args.step);
  // Sized by its values, not by kAdamWConstants: a missing one would otherwise be a silent 0.
  const std::array constants{1.0 - args.lr * args.weight_decay,
                             args.lr / (1.0 - std::pow(args.beta1, step)),
                             1.0 / std::sqrt(1.0 - std::pow(args.beta2, step))};
  static_assert(std::tuple_size_v<decltype(constants)> == kAdamWConstants,
                "adamw_step_constants must give every constant the kernels read");
  return constants;
}

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& args) {
  const auto c = adamw_step_constants(args);
  const Tensor consts =
      Tensor::from_vector(std::vector<double>(c.begin(), c.end()), {kAdamWConstants}, DType::F64)
          .to(param.device());
  adamw_update(param, grad, m, v, args, consts);
}

namespace {
void check_args(const AdamWArgs& args) {
  if (args.step < 1)
    check::fail(kOp, "step = " + std::to_string(args.step) + " must be >= 1 (it is 1-based)");
  if (!(args.beta1 >= 0.0 && args.beta1 < 1.0) || !(args.beta2 >= 0.0 && args.beta2 < 1.0))
    check::fail(kOp, "beta1 = " + std::to_string(args.beta1) +
                         " and beta2 = " + std::to_string(args.beta2) + " must lie in [0, 1)");
  if (!(args.lr >= 0.0) || !(args.eps >= 0.0) || !(args.weight_decay >= 0.0))
    check::fail(kOp, "lr = " + std::to_string(args.lr) + ", eps = " + std::to_string(args.eps) +
                         ", weight_decay = " + std::to_string(args.weight_decay) + " must be >= 0");
}

void check_tensors(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                   const Tensor& consts, const Tensor& grad_scale) {
  check::floating(kOp, param, "param");
  like_param(param, grad, "grad");
  like_param(param, m, "m");
  like_param(param, v, "v");
  if (consts.dtype() != DType::F64 || consts.numel() != kAdamWConstants)
    check::fail(kOp, "consts is " + describe(consts) + "; expected f64 [" +
                         std::to_string(kAdamWConstants) + "] (adamw_step_constants)");
  check::same_device(kOp, param, "param", consts, "consts");
  if (grad_scale.defined()) {
    if (grad_scale.numel() != 1)
      check::fail(kOp, "grad_scale is " + describe(grad_scale) + "; expected one element");
    check::same_dtype_device(kOp, grad, "grad", grad_scale, "grad_scale");
  }
}
}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& args,
                  const Tensor& consts, const Tensor& grad_scale) {
  check_tensors(param, grad, m, v, consts, grad_scale);
  check_args(args);
  backend_of(param).adamw_update(param, grad, m, v, args, consts, grad_scale);
  param.impl()->storage->mark_written();  // a weight copy of param is now stale
}

const std::vector<MultiTensorEntry>& MultiTensorTable::rows_for(const std::vector<AdamWSlot>& slots,
                                                                bool& rewrite) {
  rows_.clear();
  int64_t chunks = 0;
  for (const AdamWSlot& s : slots) {
    const int64_t n = s.param.numel();
    if (n == 0) continue;
    rows_.push_back({s.param.raw_data(), s.grad.raw_data(), s.m.raw_data(), s.v.raw_data(),
                     s.copy.defined() ? s.copy.raw_data() : nullptr, s.consts.data<double>(), n,
                     chunks});
    chunks += (n + kMultiTensorChunk - 1) / kMultiTensorChunk;
  }
  commit(slots.empty() ? Device::CPU : slots.front().param.device(), rewrite);
  return rows_;
}

const std::vector<MultiTensorEntry>& MultiTensorTable::rows_for(const std::vector<Tensor>& tensors,
                                                                bool& rewrite) {
  rows_.clear();
  int64_t chunks = 0;
  for (const Tensor& t : tensors) {
    const int64_t n = t.numel();
    if (n == 0) continue;
    rows_.push_back({nullptr, t.raw_data(), nullptr, nullptr, nullptr, nullptr, n, chunks});
    chunks += (n + kMultiTensorChunk - 1) / kMultiTensorChunk;
  }
  commit(tensors.empty() ? Device::CPU : tensors.front().device(), rewrite);
  return rows_;
}

void MultiTensorTable::commit(Device device, bool& rewrite) {
  const auto same = [](const MultiTensorEntry& a, const MultiTensorEntry& b) {
    return a.param == b.param && a.grad == b.grad && a.m == b.m && a.v == b.v &&
           a.copy == b.copy && a.consts == b.consts && a.numel == b.numel &&
           a.first_chunk == b.first_chunk;
  };
  rewrite = rows_.size() != last_.size() || !std::equal(rows_.begin(), rows_.end(), last_.begin(), same);
  const int64_t words = static_cast<int64_t>(rows_.size() * sizeof(MultiTensorEntry) / sizeof(int64_t));
  if (rewrite && device != Device::CPU &&
      (!table_.defined() || table_.device() != device || table_.numel() < words))
    table_ = Tensor::empty({words}, DType::I64, device);
  last_ = rows_;
}

void adamw_update_multi(const std::vector<AdamWSlot>& slots, const AdamWArgs& args,
                        const Tensor& grad_scale, MultiTensorTable& table) {
  if (slots.empty()) return;
  check_args(args);
  const Tensor& first = slots.front().param;
  const Tensor* first_copy = nullptr;
  for (const AdamWSlot& s : slots) {
    check_tensors(s.param, s.grad, s.m, s.v, s.consts, grad_scale);
    check::same_dtype_device(kOp, first, "slots[0].param", s.param, "param");
    if (!s.copy.defined()) continue;
    check::floating(kOp, s.copy, "copy");
    check::same_device(kOp, s.param, "param", s.copy, "copy");
    if (s.copy.numel() != s.param.numel())
      check::fail(kOp, "copy " + describe(s.copy) + " differs in size from param " +
                           describe(s.param));
    if (!first_copy) first_copy = &s.copy;
    check::same_dtype_device(kOp, *first_copy, "the first copy", s.copy, "copy");
  }
  bool rewrite = false;
  const std::vector<MultiTensorEntry>& rows = table.rows_for(slots, rewrite);
  backend_of(first).adamw_update_multi(slots, args, grad_scale, rows, table.device_rows(), rewrite);
  for (const AdamWSlot& s : slots) {
    if (s.copy.defined() && s.copy.same(allocated_weight_copy(s.param)))
      mark_written_with_copy(s.param);
    else
      s.param.impl()->storage->mark_written();
  }
}

Tensor sum_squares_multi(const std::vector<Tensor>& xs, Device device, MultiTensorTable& table) {
  constexpr const char* kNormOp = "sum_squares_multi";
  for (const Tensor& x : xs) {
    check::floating(kNormOp, x, "x");
    check::same_dtype_device(kNormOp, xs.front(), "xs[0]", x, "x");
  }
  if (!xs.empty() && xs.front().device() != device)
    check::fail(kNormOp, "xs[0] is " + describe(xs.front()) + ", not on " + device_name(device));
  bool rewrite = false;
  const std::vector<MultiTensorEntry>& rows = table.rows_for(xs, rewrite);
  Tensor out = Tensor::empty({}, DType::F64, device);
  backend(device).sum_squares_multi(xs, rows, table.device_rows(), rewrite, out);
  return out;
}

AdamWStepConstants::AdamWStepConstants(const AdamWArgs& hyper, Device device)
    : hyper_(hyper),
      decayed_(Tensor::zeros({kAdamWConstants}, DType::F64, device)),
      plain_(Tensor::zeros({kAdamWConstants}, DType::F64, device)) {}

void AdamWStepConstants::set(double lr, int64_t step) {
  hyper_.lr = lr;
  hyper_.step = step;
  for (bool decays : {true, false}) {
    const auto c = adamw_step_constants(args(decays));
    Tensor dst = tensor(decays);
    dst.copy_from(Tensor::from_vector(std::vector<double>(c.begin(), c.end()), {kAdamWConstants},
                                      DType::F64));
  }
}

AdamWArgs AdamWStepConstants::args(bool decays) const {
  AdamWArgs a = hyper_;
  if (!decays) a.weight_decay = 0.0;
  return a;
}

}  // namespace mod
