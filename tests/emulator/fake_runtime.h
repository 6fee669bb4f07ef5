// A stand-in for the emulator's CUDA runtime (emulator/include/emu/runtime.h) small enough for
// the cuBLAS/cuBLASLt stand-in tests (blas_test.cpp), until emulator/runtime/ lands and
// replaces it: work runs when enqueued unless a capture is on, device memory is aligned_alloc'd
// and registered, sticky errors are recorded. One capture flag covers every stream.
#pragma once

#include <cstddef>
#include <string>

namespace emu::fake {

// While on, every stream reads as captured in global mode: enqueued work is recorded (run by
// replay()), device_malloc fails.
void set_capturing(bool on);
// Runs and forgets the work recorded while capturing.
void replay();
size_t recorded();

// Device memory outside device_malloc (none of the tests needs more than device_malloc's).
void device_free(void* p);

// The last fail_sticky message and code (0 if none); clear_sticky forgets them.
int sticky_code();
std::string sticky_message();
void clear_sticky();

}  // namespace emu::fake
