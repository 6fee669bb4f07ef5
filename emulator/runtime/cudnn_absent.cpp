// cuDNN under the emulator: absent, as on a machine without libcudnn. cudnnGetVersion reports 0,
// below the backend's floor, so its attention takes the project's own kernels (the ones the
// emulator exists to test); every other call says cuDNN is not here.
#include <cudnn_graph.h>

#include <cstring>

namespace {
constexpr const char* kAbsent = "cuDNN is not available under the CPU SIMT emulator";
}  // namespace

extern "C" {

size_t cudnnGetVersion(void) {
  return 0;
}

const char* cudnnGetErrorString(cudnnStatus_t /*status*/) {
  return kAbsent;
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  std::strncpy(message, kAbsent, max_size - 1);
  message[max_size - 1] = '\0';
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* /*handle*/) {
  return CUDNN_STATUS_NOT_INITIALIZED;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t, cudaStream_t) {
  return CUDNN_STATUS_NOT_INITIALIZED;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t,
                                           cudnnBackendDescriptor_t*) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, const void*) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, int64_t*, void*) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t, cudnnBackendDescriptor_t,
                                  cudnnBackendDescriptor_t) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

}  // extern "C"
