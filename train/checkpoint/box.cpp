// Box geometry and the strided copy between boxes (see box.h).
#include "train/checkpoint/box.h"

#include <algorithm>
#include <cstring>

namespace mod::ckpt {

Box slab_box(const Shape& local_shape, int shard_dim, int64_t offset) {
  Box b{Shape(local_shape.size(), 0), local_shape};
  if (shard_dim >= 0) {
    b.lo[shard_dim] = offset;
    b.hi[shard_dim] = offset + local_shape[shard_dim];
  }
  return b;
}

Box intersect(const Box& a, const Box& b) {
  Box out{a.lo, a.hi};
  for (size_t d = 0; d < a.lo.size(); ++d) {
    out.lo[d] = std::max(a.lo[d], b.lo[d]);
    out.hi[d] = std::max(out.lo[d], std::min(a.hi[d], b.hi[d]));
  }
  return out;
}

int64_t box_numel(const Box& b) {
  int64_t n = 1;
  for (size_t d = 0; d < b.lo.size(); ++d) n *= std::max<int64_t>(0, b.hi[d] - b.lo[d]);
  return n;
}

void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box, const Box& region,
              size_t elem_size) {
  const size_t nd = region.lo.size();
  if (box_numel(region) == 0) return;
  // Row-major strides (in elements) of both buffers.
  std::vector<int64_t> src_stride(nd, 1), dst_stride(nd, 1);
  for (size_t d = nd; d-- > 1;) {
    src_stride[d - 1] = src_stride[d] * (src_box.hi[d] - src_box.lo[d]);
    dst_stride[d - 1] = dst_stride[d] * (dst_box.hi[d] - dst_box.lo[d]);
  }
  // Trailing dimensions the region spans fully in both buffers merge into one memcpy run.
  size_t k = nd;
  int64_t run = 1;
  while (k > 0) {
    const size_t d = k - 1;
    const int64_t extent = region.hi[d] - region.lo[d];
    run *= extent;
    --k;
    const bool full =
        extent == src_box.hi[d] - src_box.lo[d] && extent == dst_box.hi[d] - dst_box.lo[d];
    if (!full) break;
  }
  // Dimensions [0, k) are iterated; dimension k (if any) starts the run.
  const auto* s = static_cast<const char*>(src);
  auto* t = static_cast<char*>(dst);
  std::vector<int64_t> idx(region.lo.begin(), region.lo.begin() + static_cast<std::ptrdiff_t>(k));
  const size_t run_bytes = static_cast<size_t>(run) * elem_size;
  for (;;) {
    int64_t so = 0, to = 0;
    for (size_t d = 0; d < nd; ++d) {
      const int64_t i = d < k ? idx[d] : region.lo[d];
      so += (i - src_box.lo[d]) * src_stride[d];
      to += (i - dst_box.lo[d]) * dst_stride[d];
    }
    std::memcpy(t + to * static_cast<int64_t>(elem_size), s + so * static_cast<int64_t>(elem_size),
                run_bytes);
    size_t d = k;
    while (d > 0 && ++idx[d - 1] == region.hi[d - 1]) {
      idx[d - 1] = region.lo[d - 1];
      --d;
    }
    if (d == 0) return;
  }
}

}  // namespace mod::ckpt
