// Modules own named parameters. A parameter's name is its path from the root module
// ("blocks.1.attn.wq.weight"): the key in checkpoints and the unit of tensor-parallel sharding
// metadata. Children are registered in order, so named_parameters() is deterministic.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/norm.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mod::nn {

class Module {
 public:
  virtual ~Module() = default;

  // Every parameter in this module and its children, depth first in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  Tensor parameter(const std::string& path) const;  // throws naming the path if absent
  int64_t num_parameters() const;
  void zero_grad();
  // Moves every parameter to the device in place (Tensor::move_to); gradients are dropped.
  void to(Device device);
  // The child module at a dotted path ("blocks.1.attn.wq"); null when absent.
  std::shared_ptr<Module> find_module(const std::string& path) const;

 protected:
  // Marks t as a trainable leaf; returns it for the caller to keep.
  Tensor register_parameter(const std::string& name, Tensor t);
  // Swaps a registered parameter for another tensor (a tensor-parallel shard) under the same name.
  Tensor replace_parameter(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    add_child(name, child);
    return child;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> child);
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// An ordered list of child modules named "0", "1", ... ("blocks.3.attn.wq.weight").
class ModuleList : public Module {
 public:
  template <typename M>
  std::shared_ptr<M> add(std::shared_ptr<M> child) {
    return register_module(std::to_string(size_++), std::move(child));
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

// Hooks tensor parallelism (parallel/parallelize.cpp) wraps a layer's product with, so that
// modules stay unaware of parallelism: typically an identity-forward / all-reduce-backward on
// the input of a column-parallel layer and an all-reduce on the output of a row-parallel one.
using TensorHook = std::function<Tensor(const Tensor&)>;

// y = x W^T (+ b); W [out, in] initialised normal(0, init_std).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, Rng& rng, double init_std,
         DType dtype = DType::F32);
  // output(input(x) W^T) (+ b); the hooks are identities until shard() sets them.
  Tensor forward(const Tensor& x) const;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  // The hooks alone, for an op that fuses this layer's product with its neighbours' (the MLP's
  // gelu_mlp): forward multiplies input(x) and returns output(product) (+ bias).
  Tensor input(const Tensor& x) const { return input_ ? input_(x) : x; }
  Tensor output(const Tensor& y) const { return output_ ? output_(y) : y; }
  // Replaces weight and bias by this rank's shards (bias may be undefined) and sets the hooks.
  void shard(Tensor weight, Tensor bias, TensorHook input, TensorHook output);

 private:
  Tensor weight_, bias_;
  TensorHook input_, output_;
};

// ids [...] -> [..., D]; table [V, D] initialised normal(0, init_std).
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, Rng& rng, double init_std, DType dtype = DType::F32);
  Tensor forward(const Tensor& ids) const;
  // h [..., D] -> h table^T [..., V]: the tied LM head.
  Tensor attend(const Tensor& h) const;
  const Tensor& weight() const { return weight_; }
  // Replaces the table by this rank's rows; lookup(ids, table) replaces forward's lookup and
  // attend_input runs on h before attend's product.
  using Lookup = std::function<Tensor(const Tensor& ids, const Tensor& table)>;
  void shard(Tensor table, Lookup lookup, TensorHook attend_input);

 private:
  Tensor weight_;
  Lookup lookup_;
  TensorHook attend_input_;
};

// A normalisation over the last dim, x [..., D] -> [..., D]: what a model holds where its
// config picks the kind (model.norm).
class Norm : public Module {
 public:
  virtual Tensor forward(const Tensor& x) const = 0;
  // The residual add before this norm fused with it: {x + a, forward(x + a)} in one pass
  // (core/ops/norm.h), equal to add() then forward() bit for bit on the CPU.
  virtual AddNorm add_forward(const Tensor& x, const Tensor& a) const = 0;
};

// RMSNorm with a learned gain initialised to 1 (parameter "weight").
class RMSNorm : public Norm {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-5, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) const override;
  AddNorm add_forward(const Tensor& x, const Tensor& a) const override;

 private:
  Tensor weight_;
  double eps_;
};

// LayerNorm with a learned gain initialised to 1 and a bias to 0 ("weight", "bias"), as GPT-2.
class LayerNorm : public Norm {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, DType dtype = DType::F32);
  Tensor forward(const Tensor& x) const override;
  AddNorm add_forward(const Tensor& x, const Tensor& a) const override;

 private:
  Tensor weight_, bias_;
  double eps_;
};

}  // namespace mod::nn
