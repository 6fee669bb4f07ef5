// Slab geometry for resharding: the part of a tensor a piece holds, or a read asks for, is a box
// [lo, hi) in global coordinates. Pieces are boxes; a read copies the intersection of its box
// with each piece's box, so any saved sharding can be read back at any other.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace mod::ckpt {

struct Box {
  Shape lo, hi;  // per dimension, hi exclusive
};

// The slab [offset, offset + local_shape[shard_dim]) along shard_dim (-1: the whole tensor).
Box slab_box(const Shape& local_shape, int shard_dim, int64_t offset);
Box intersect(const Box& a, const Box& b);  // empty when any extent is <= 0
int64_t box_numel(const Box& b);            // 0 for an empty box

// Copies `region` (inside both boxes) from src, which holds src_box in row-major order, into
// dst, which holds dst_box; elements are elem_size bytes. Contiguous runs go by memcpy.
void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box, const Box& region,
              size_t elem_size);

}  // namespace mod::ckpt
