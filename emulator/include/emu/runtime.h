// The emulator's CUDA runtime as the library stand-ins (cuBLAS, cuBLASLt) see it: work queued on
// a stream, the capture state, device memory. The CUDA API itself (cudaMalloc, streams, graphs)
// is defined in emulator/runtime/ under the toolkit's own declarations (cuda_runtime_api.h).
//
// Execution model: a stream runs its work in order; work on different streams, ordered only by
// events, may run in any order consistent with them (CUDA C++ Programming Guide, "Streams"). By
// default work waits for the host's next synchronisation and then runs latest-issued first
// wherever that freedom allows (emulator/runtime/streams.cpp), so a missing event shows;
// MOD_EMU_STREAMS=at_issue runs it when issued. While a stream is captured, work is recorded into
// the capturing graph instead and runs only when the graph is launched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

// The CUPTI stand-in's view of device work (emulator/libs/cupti.cpp): every item as it runs,
// named as issued (a kernel's launch name, "cudaMemcpyAsync HtoD", "ncclAllReduce", ...), its
// start and end in host nanoseconds. Exported from every executable that links the runtime, so
// a libcupti.so opened with dlopen finds it; null stops observing.
extern "C" {
typedef void (*emu_activity_observer)(const char* what, uint64_t start_ns, uint64_t end_ns);
void emu_observe_activity(emu_activity_observer observer);
}

namespace emu::rt {

// Runs `work` now, or records it as a node of the graph `stream` is captured into. `what` names
// it in messages ("cublasGemmStridedBatchedEx"). An error raised while it runs
// (fail_sticky) is returned by the next runtime call, as a kernel's fault is on a GPU.
cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work);
// enqueue for a collective (the NCCL stand-in): it also waits for every collective this process
// issued before it, so ranks that issue the same sequence run it in the same order.
cudaError_t enqueue_collective(cudaStream_t stream, const char* what, std::function<void()> work);
// Runs all queued work (what ncclCommDestroy and ncclCommFinalize wait for).
void synchronize();

// Whether `stream` is being captured (cudaStreamIsCapturing's answer).
bool capturing(cudaStream_t stream);

// A call CUDA forbids while `stream` is captured (CUDA C++ Programming Guide, "CUDA Graphs",
// "Prohibited and Unhandled Operations"): invalidates that capture, records `what` for the
// message cudaStreamEndCapture's failure prints, and returns cudaErrorStreamCaptureUnsupported.
cudaError_t capture_violation(cudaStream_t stream, const std::string& what);

// cudaMalloc as the libraries' default pools call it: an error while this thread has a
// capture active in global or thread-local mode ("potentially unsafe API calls" are
// prohibited), else memory from the device arena.
cudaError_t device_malloc(void** ptr, size_t bytes, const char* what);

// Whether [ptr, ptr + bytes) lies inside one live device allocation.
bool device_range(const void* ptr, size_t bytes);

// Makes `code` the process's sticky error with `message` (printed once to stderr), as a
// device-side fault is on a GPU: every later runtime call returns it.
void fail_sticky(cudaError_t code, const std::string& message);
const std::string& sticky_message();  // the first sticky error's message, else empty

// Tests only: forgets the sticky error, so one process can check several planted faults.
void reset_for_tests();

}  // namespace emu::rt
