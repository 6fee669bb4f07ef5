// CPU kernels of batched decoding (Backend's decode family): the reference for the CUDA ones.
// Every kernel walks the B sequences independently, so sequence b's results depend on its own
// rows only (a batch equals its sequences decoded one at a time).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/philox.h"

namespace mod::cpu {

namespace {
// The kept tokens' exp((l - max) / temperature) in el [V] (0 where not kept), SampleArgs's rules.
// Only a filter sorts: top-k alone selects the k-th value, top-p sorts the row.
template <typename T>
void kept_weights(const T* l, int64_t v, const SampleArgs& a, std::vector<double>& el) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < v; ++i) m = std::max(m, static_cast<double>(l[i]));
  const bool top_k = a.top_k > 0 && a.top_k < v, top_p = a.top_p < 1;
  std::vector<double> sorted;
  if (top_k || top_p) sorted.assign(l, l + v);
  if (top_p)
    std::sort(sorted.begin(), sorted.end(), [](double x, double y) { return x > y; });
  else if (top_k)
    std::nth_element(sorted.begin(), sorted.begin() + (a.top_k - 1), sorted.end(),
                     [](double x, double y) { return x > y; });
  const double kth = top_k ? sorted[a.top_k - 1] : -std::numeric_limits<double>::infinity();
  double z = 0;
  for (int64_t i = 0; i < v; ++i) {
    el[i] = l[i] >= kth ? std::exp((l[i] - m) / a.temperature) : 0.0;
    z += el[i];
  }
  if (!top_p) return;
  // The largest value whose tokens (and all larger ones) reach top_p of the mass.
  double mass = 0, threshold = sorted[0];
  for (int64_t i = 0; i < v && sorted[i] >= kth; ++i) {
    mass += std::exp((sorted[i] - m) / a.temperature);
    threshold = sorted[i];
    if (mass >= a.top_p * z) break;
  }
  for (int64_t i = 0; i < v; ++i)
    if (l[i] < threshold) el[i] = 0;
}
}  // namespace

void CpuBackend::decode_admit(const Tensor& decision, const Tensor& active, Tensor& admit) {
  dispatch_float(decision.dtype(), "decode_admit", [&](auto z) {
    using T = decltype(z);
    const T* d = decision.data<T>();
    const int64_t* on = active.data<int64_t>();
    int64_t* out = admit.data<int64_t>();
    for (int64_t b = 0; b < decision.numel(); ++b) out[b] = on[b] != 0 && d[b] > 0 ? 1 : 0;
  });
}

void CpuBackend::kv_cache_append(const Tensor& k, const Tensor& v, const Tensor& admit,
                                 const Tensor& rows, Tensor& len, Tensor& k_cache,
                                 Tensor& v_cache) {
  const int64_t b_n = k_cache.size(0), s = k_cache.size(1), w = k_cache.numel() / (b_n * s);
  const int64_t n_rows = k.size(0);
  const size_t row = static_cast<size_t>(w) * dtype_size(k.dtype());
  const char* ks = static_cast<const char*>(k.raw_data());
  const char* vs = static_cast<const char*>(v.raw_data());
  char* kc = static_cast<char*>(k_cache.raw_data());
  char* vc = static_cast<char*>(v_cache.raw_data());
  int64_t* n = len.data<int64_t>();
  for (int64_t i = 0; i < n_rows; ++i) {
    const int64_t b = rows.defined() ? rows.data<int64_t>()[i] : i;
    if ((admit.defined() && admit.data<int64_t>()[i] == 0) || n[b] >= s) continue;
    std::memcpy(kc + (b * s + n[b]) * row, ks + i * row, row);
    std::memcpy(vc + (b * s + n[b]) * row, vs + i * row, row);
    ++n[b];
  }
}

void CpuBackend::decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                  const Tensor& len, const Tensor& rows, Tensor& out) {
  const int64_t n_rows = q.size(0), h_n = q.size(1), dh = q.size(2), s = k_cache.size(1);
  const int64_t ld = h_n * dh;
  dispatch_float(q.dtype(), "decode_attention", [&](auto z) {
    using T = decltype(z);
    const T *qp = q.data<T>(), *kp = k_cache.data<T>(), *vp = v_cache.data<T>();
    T* op = out.data<T>();
    const int64_t* n = len.data<int64_t>();
    const T scale = T(1) / std::sqrt(static_cast<T>(dh));
  // A thread team costs more than one step's attention until the caches are long (the fused
  // attention's threshold, B*H*S*Dh).
#pragma omp parallel for collapse(2) schedule(static) if (n_rows * h_n * s * dh > (1 << 20))
    for (int64_t i = 0; i < n_rows; ++i)
      for (int64_t h = 0; h < h_n; ++h) {
        const int64_t b = rows.defined() ? rows.data<int64_t>()[i] : i;
        const T* qr = qp + (i * h_n + h) * dh;
        T* o = op + (i * h_n + h) * dh;
        std::fill(o, o + dh, T(0));
        const int64_t keys = std::min(n[b], s);
        if (keys == 0) continue;
        std::vector<T> p(static_cast<size_t>(keys));
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          const T* kr = kp + (b * s + j) * ld + h * dh;
          T dot = 0;
          for (int64_t d = 0; d < dh; ++d) dot += qr[d] * kr[d];
          p[j] = dot * scale;
          m = std::max(m, p[j]);
        }
        T sum = 0;
        for (int64_t j = 0; j < keys; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (int64_t j = 0; j < keys; ++j) {
          const T* vr = vp + (b * s + j) * ld + h * dh;
          const T w = p[j] / sum;
          for (int64_t d = 0; d < dh; ++d) o[d] += w * vr[d];
        }
      }
  });
}

void CpuBackend::masked_add(const Tensor& x, const Tensor& u, const Tensor& admit, Tensor& out) {
  const int64_t b_n = x.size(0), n = x.numel() / b_n;
  dispatch_float(x.dtype(), "masked_add", [&](auto z) {
    using T = decltype(z);
    const T *xp = x.data<T>(), *up = u.data<T>();
    T* op = out.data<T>();
    const int64_t* on = admit.data<int64_t>();
    for (int64_t b = 0; b < b_n; ++b)
      for (int64_t i = b * n; i < (b + 1) * n; ++i) op[i] = on[b] != 0 ? xp[i] + up[i] : xp[i];
  });
}

void CpuBackend::sample_tokens(const Tensor& logits, const Tensor& pos, const SampleArgs& a,
                               Tensor& next) {
  const int64_t b_n = logits.size(0), v = logits.size(1);
  dispatch_float(logits.dtype(), "sample_tokens", [&](auto z) {
    using T = decltype(z);
    const int64_t* p = pos.data<int64_t>();
    int64_t* out = next.data<int64_t>();
    std::vector<double> el(static_cast<size_t>(v));
    for (int64_t b = 0; b < b_n; ++b) {
      const T* l = logits.data<T>() + b * v;
      if (!std::all_of(l, l + v, [](T x) { return std::isfinite(static_cast<double>(x)); })) {
        out[b] = kNonFiniteLogitsToken;
        continue;
      }
      if (a.temperature <= 0) {
        out[b] = std::max_element(l, l + v) - l;  // the first of the largest
        continue;
      }
      kept_weights(l, v, a, el);
      double total = 0;
      for (double e : el) total += e;
      double target = philox_uniform(a.seed, a.first_stream + static_cast<uint64_t>(b),
                                         static_cast<uint64_t>(p[b])) *
                      total;
      int64_t pick = -1;
      for (int64_t i = 0; i < v; ++i) {
        if (el[i] == 0) continue;
        pick = i;  // the last kept token, should rounding leave target above the sum
        target -= el[i];
        if (target < 0) break;
      }
      out[b] = pick;
    }
  });
}

void CpuBackend::decode_advance(const Tensor& next, const Tensor& prompt_len, const Tensor& stop,
                                int64_t eot, Tensor& tokens, Tensor& pos, Tensor& cur,
                                Tensor& active) {
  const int64_t b_n = tokens.size(0), l = tokens.size(1);
  const int64_t *nx = next.data<int64_t>(), *pl = prompt_len.data<int64_t>(),
                *st = stop.data<int64_t>();
  int64_t *tok = tokens.data<int64_t>(), *ps = pos.data<int64_t>(), *cu = cur.data<int64_t>(),
          *on = active.data<int64_t>();
  for (int64_t b = 0; b < b_n; ++b) {
    const int64_t p = ps[b] + 1;
    if (p >= l) {
      on[b] = 0;
      continue;
    }
    const bool generated = p >= pl[b];
    if (generated && nx[b] == kNonFiniteLogitsToken) {  // kept as the marker; cur stays an id
      tok[b * l + p] = nx[b];
      on[b] = 0;
      ps[b] = p;
      continue;
    }
    if (generated) tok[b * l + p] = nx[b];
    cu[b] = tok[b * l + p];
    if (p >= st[b] || (generated && eot >= 0 && nx[b] == eot)) on[b] = 0;
    ps[b] = p;
  }
}

}  // namespace mod::cpu
