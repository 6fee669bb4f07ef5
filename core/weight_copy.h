// Weight copies: a parameter's values kept in mixed precision's compute dtype (bf16 beside an
// f32 master) by its optimizer, which writes the copy in the pass that updates the master
// (adamw_update_multi), so a bf16 forward reads the copy instead of casting every weight
// every step. autocast (core/ops/elementwise.h) returns it for a parameter that keeps one, with
// the cast's backward: the gradient reaches the master in the master's dtype.
//
// Invariant: a copy is read only while it equals cast(master). Each copy remembers the master
// storage's stamp (Storage::stamp) when it was written; every write the tensor layer sees
// (Tensor::copy_from and set: checkpoint loads, ZeRO-1's all-gather; any optimizer update)
// takes a new stamp, and weight_copy_for rewrites a stale copy (convert) before handing it out.
// Writes through raw data pointers are not seen: call Storage::mark_written after them.
// ZeRO-3 writes the copies of a unit's copy part without their masters (weight_copy_to_write,
// mark_copy_current): the copy is then cast(master) of the values the master would hold, the
// master itself released; rewriting such a copy would read the released master and throw.
// Checkpoints hold the masters only; a copy is state derived from them.
// Tested by: tests/core/routing_loss_optim_test.cpp (a stale copy is rewritten before use),
// tests/parallel/optimizer_test.cpp (runs with copies equal runs without, resume included).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mod {

struct WeightCopy {
  DType dtype;         // the autocast dtype it serves
  Tensor value;        // allocated the first time a forward reads it (params never cast get none)
  uint64_t stamp = 0;  // the master storage's stamp when value was last written
};

// From now on `param` (a leaf) keeps a copy in `dtype`, made when a forward first reads it.
void keep_weight_copy(const Tensor& param, DType dtype);
// Drops param's copy, if any.
void drop_weight_copy(const Tensor& param);
// param's copy in dtype, rewritten from the master first when stale (a convert on param's
// device); undefined when param keeps none in dtype.
Tensor weight_copy_for(const Tensor& param, DType dtype);
// The copy param's optimizer writes with it: allocated and on param's device (else undefined).
Tensor allocated_weight_copy(const Tensor& param);
// After one pass wrote param and the copy allocated_weight_copy gave: the master takes a new
// stamp and the copy is current at it.
void mark_written_with_copy(const Tensor& param);
// For a writer that fills the copy without the master (ZeRO-3 gathers a unit's bf16 part into
// the copies while their masters stay released, parallel/zero3.h): param's copy in dtype,
// allocated (contents undefined) if it has none on param's device yet. Throws, naming param,
// when param keeps no copy in dtype.
Tensor weight_copy_to_write(const Tensor& param, DType dtype);
// After such a write: the copy is current at the master's stamp as it is (the master untouched),
// so weight_copy_for hands it out instead of rewriting it from the master.
void mark_copy_current(const Tensor& param);

}  // namespace mod
