// A small owner of cuDNN backend (graph API) descriptors, for the fused attention graphs in
// attention_cudnn.cu: GraphBuilder creates, sets and finalises descriptors and frees them all
// if a build fails. Invariant: every failure while building throws BuildError (the caller
// returns false, having launched nothing); nothing here executes a plan.
#pragma once

#include <cudnn_graph.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mod::cuda::cudnn {

// cuDNN's name for a status and, when it left one, its last detailed message.
inline std::string cudnn_text(cudnnStatus_t status) {
  std::string text = cudnnGetErrorString(status);
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') text += std::string(" (") + detail + ")";
  return text;
}

inline constexpr int64_t kAlignment = 16;  // bytes; every bound pointer is checked against it
// Unique ids below this are tensors bound at execution; virtual tensors are numbered from it.
inline constexpr int64_t kFirstVirtual = 100;

using Dims = std::array<int64_t, 4>;

// Why a graph or plan could not be built; caught at the entry points, which return false.
struct BuildError {
  std::string what;
};

inline void check_build(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw BuildError{std::string(what) + ": " + cudnn_text(status)};
}

// Creates, finalises and owns backend descriptors; a failed build frees them all, a successful
// one hands them to the Plan, which keeps them for the life of the process.
class GraphBuilder {
 public:
  explicit GraphBuilder(cudnnHandle_t handle) : handle_(handle) {}
  ~GraphBuilder() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  GraphBuilder(const GraphBuilder&) = delete;
  GraphBuilder& operator=(const GraphBuilder&) = delete;

  // A tensor bound to memory at execution (uid < kFirstVirtual), or a by-value f32 scalar.
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const Dims& dims,
                                  const Dims& strides) {
    return make_tensor(uid, type, dims, strides, false, false);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return make_tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }
  // An intermediate that never reaches memory.
  cudnnBackendDescriptor_t virt(cudnnDataType_t type, const Dims& dims, const Dims& strides) {
    return make_tensor(next_virtual_++, type, dims, strides, true, false);
  }

  // y = mode(x[, b[, t]]) computed in `math`; axis only for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, "pointwise math");
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    finalize(pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op =
        create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    link(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op descriptor");
    link(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (b != nullptr) link(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    if (t != nullptr) link(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise t");
    link(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    finalize(op, "pointwise operation");
    ops_.push_back(op);
  }
  void unary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    pointwise(mode, CUDNN_DATA_FLOAT, x, nullptr, nullptr, y);
  }
  void binary(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
              cudnnBackendDescriptor_t y) {
    pointwise(mode, CUDNN_DATA_FLOAT, x, b, nullptr, y);
  }

  // c = a b over the last two dims, batched over the first two, accumulated in f32.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
    finalize(mm, "matmul descriptor");
    cudnnBackendDescriptor_t op =
        create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    link(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul a");
    link(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul b");
    link(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul c");
    link(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm, "matmul op descriptor");
    finalize(op, "matmul operation");
    ops_.push_back(op);
  }

  // y = reduce(x) over the dims where y has extent 1, in f32.
  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t y) {
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t red = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
        "reduction operator");
    set(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp,
        "reduction compute type");
    finalize(red, "reduction descriptor");
    cudnnBackendDescriptor_t op =
        create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    link(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction x");
    link(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction y");
    link(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red, "reduction op descriptor");
    finalize(op, "reduction operation");
    ops_.push_back(op);
  }

  // y = x seen through y's dims and strides (here: a transpose of the last two dims).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op =
        create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    link(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x, "reshape x");
    link(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y, "reshape y");
    finalize(op, "reshape operation");
    ops_.push_back(op);
  }

  // Finalises the operation graph and returns the first execution plan among the heuristics'
  // engine configurations (mode A, then the fallback list) that cuDNN finalises.
  cudnnBackendDescriptor_t finalize_plan() {
    cudnnBackendDescriptor_t graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, "graph handle");
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        static_cast<int64_t>(ops_.size()), ops_.data(), "graph operations");
    finalize(graph, "operation graph");
    std::string refusals;
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      cudnnBackendDescriptor_t heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
      link(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
      set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
      finalize(heur, "engine heuristics");
      int64_t count = 0;
      check_build(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                  "heuristics result count");
      if (count <= 0) continue;
      std::vector<cudnnBackendDescriptor_t> configs(static_cast<size_t>(count));
      for (auto& c : configs) c = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
      int64_t returned = 0;
      check_build(
          cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, configs.data()),
          "heuristics results");
      for (int64_t i = 0; i < returned && i < count; ++i) {
        cudnnBackendDescriptor_t plan =
            create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_, "plan handle");
        link(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[static_cast<size_t>(i)],
             "plan engine config");
        const cudnnStatus_t status = cudnnBackendFinalize(plan);
        if (status == CUDNN_STATUS_SUCCESS) return plan;
        if (refusals.empty()) refusals = cudnn_text(status);
      }
    }
    throw BuildError{"no engine accepts the graph" +
                     (refusals.empty() ? std::string() : "; first refusal: " + refusals)};
  }

  std::vector<cudnnBackendDescriptor_t> release() {
    ops_.clear();
    return std::move(owned_);
  }

 private:
  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type, const char* what) {
    cudnnBackendDescriptor_t d = nullptr;
    check_build(cudnnBackendCreateDescriptor(type, &d), what);
    owned_.push_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const void* values, const char* what) {
    check_build(cudnnBackendSetAttribute(d, name, type, count, values), what);
  }
  void link(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
            cudnnBackendDescriptor_t value, const char* what) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, what);
  }
  void finalize(cudnnBackendDescriptor_t d, const char* what) {
    check_build(cudnnBackendFinalize(d), what);
  }
  cudnnBackendDescriptor_t make_tensor(int64_t uid, cudnnDataType_t type, const Dims& dims,
                                       const Dims& strides, bool is_virtual, bool by_value) {
    cudnnBackendDescriptor_t t = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor data type");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment, "tensor alignment");
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor is_virtual");
    if (by_value)
      set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by_value");
    finalize(t, "tensor");
    return t;
  }

  cudnnHandle_t handle_;
  std::vector<cudnnBackendDescriptor_t> owned_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

}  // namespace mod::cuda::cudnn
