// Module parameter registry and the basic layers.
#include "core/nn/module.h"

#include <stdexcept>

#include "core/all_ops.h"

namespace mod::nn {

namespace {
void check_name(const std::string& name) {
  if (name.empty() || name.find('.') != std::string::npos)
    throw std::invalid_argument("module: name '" + name + "' must be non-empty without '.'");
}
}  // namespace

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_name(name);
  for (const auto& [n, _] : params_)
    if (n == name) throw std::invalid_argument("module: parameter '" + name + "' registered twice");
  t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::replace_parameter(const std::string& name, Tensor t) {
  for (auto& [n, p] : params_)
    if (n == name) {
      t.set_requires_grad(true);
      p = t;
      return t;
    }
  throw std::invalid_argument("module: no parameter '" + name + "' to replace");
}

std::shared_ptr<Module> Module::find_module(const std::string& path) const {
  const size_t dot = path.find('.');
  const std::string head = path.substr(0, dot);
  for (const auto& [name, child] : children_)
    if (name == head) return dot == std::string::npos ? child : child->find_module(path.substr(dot + 1));
  return nullptr;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> child) {
  check_name(name);
  for (const auto& [n, _] : children_)
    if (n == name) throw std::invalid_argument("module: child '" + name + "' registered twice");
  children_.emplace_back(name, std::move(child));
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : params_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters()) out.push_back(t);
  return out;
}

Tensor Module::parameter(const std::string& path) const {
  for (auto& [name, t] : named_parameters())
    if (name == path) return t;
  throw std::out_of_range("module: no parameter named '" + path + "'");
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [_, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::to(Device device) {
  for (auto& [name, p] : named_parameters()) {
    p.zero_grad();
    p.move_to(device);
  }
}

void Module::zero_grad() {
  for (auto& [_, t] : named_parameters()) t.zero_grad();
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Rng& rng, double init_std,
               DType dtype) {
  weight_ = register_parameter("weight", randn({out_features, in_features}, rng, dtype, init_std));
  if (bias) bias_ = register_parameter("bias", Tensor::zeros({out_features}, dtype));
}

Tensor Linear::forward(const Tensor& x) const {
  const Tensor y = output(linear(autocast(input(x)), autocast(weight_)));
  return bias_.defined() ? bias_add(y, autocast(bias_)) : y;
}

void Linear::shard(Tensor weight, Tensor bias, TensorHook input, TensorHook output) {
  weight_ = replace_parameter("weight", std::move(weight));
  if (bias_.defined()) bias_ = replace_parameter("bias", std::move(bias));
  input_ = std::move(input);
  output_ = std::move(output);
}

Embedding::Embedding(int64_t vocab, int64_t dim, Rng& rng, double init_std, DType dtype) {
  weight_ = register_parameter("weight", randn({vocab, dim}, rng, dtype, init_std));
}

Tensor Embedding::forward(const Tensor& ids) const {
  return autocast(lookup_ ? lookup_(ids, weight_) : embedding(ids, weight_));
}

Tensor Embedding::attend(const Tensor& h) const {
  return linear(autocast(attend_input_ ? attend_input_(h) : h), autocast(weight_));
}

void Embedding::shard(Tensor table, Lookup lookup, TensorHook attend_input) {
  weight_ = replace_parameter("weight", std::move(table));
  lookup_ = std::move(lookup);
  attend_input_ = std::move(attend_input);
}

RMSNorm::RMSNorm(int64_t dim, double eps, DType dtype) : eps_(eps) {
  weight_ = register_parameter("weight", Tensor::full({dim}, 1.0, dtype));
}

Tensor RMSNorm::forward(const Tensor& x) const {
  return rmsnorm(autocast(x), autocast(weight_), eps_);
}

AddNorm RMSNorm::add_forward(const Tensor& x, const Tensor& a) const {
  return add_rmsnorm(autocast(x), autocast(a), autocast(weight_), eps_);
}

LayerNorm::LayerNorm(int64_t dim, double eps, DType dtype) : eps_(eps) {
  weight_ = register_parameter("weight", Tensor::full({dim}, 1.0, dtype));
  bias_ = register_parameter("bias", Tensor::zeros({dim}, dtype));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return layernorm(autocast(x), autocast(weight_), autocast(bias_), eps_);
}

AddNorm LayerNorm::add_forward(const Tensor& x, const Tensor& a) const {
  return add_layernorm(autocast(x), autocast(a), autocast(weight_), autocast(bias_), eps_);
}

}  // namespace mod::nn
