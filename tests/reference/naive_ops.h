// Naive reference implementations: plain loops in double over flat vectors, written for
// obviousness, not speed. Tests and benchmarks check the real kernels against these.
// Shapes as in core/backend.h; every function returns the flat output.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace mod::reference {

using Vec = std::vector<double>;

// c [M,N] = a [M,K] @ b^T where b is [N,K] (the linear layer).
inline Vec matmul_nt(const Vec& a, const Vec& b, int64_t m, int64_t n, int64_t k) {
  Vec c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[i * k + p] * b[j * k + p];
      c[i * n + j] = s;
    }
  return c;
}

inline Vec rmsnorm(const Vec& x, const Vec& w, int64_t n, int64_t d, double eps) {
  Vec y(n * d);
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += x[r * d + i] * x[r * d + i];
    const double s = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = x[r * d + i] * s * w[i];
  }
  return y;
}

inline Vec layernorm(const Vec& x, const Vec& w, const Vec& b, int64_t n, int64_t d, double eps) {
  Vec y(n * d);
  for (int64_t r = 0; r < n; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mu += x[r * d + i];
    mu /= d;
    for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mu) * (x[r * d + i] - mu);
    const double s = 1.0 / std::sqrt(var / d + eps);
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = (x[r * d + i] - mu) * s * w[i] + b[i];
  }
  return y;
}

inline double gelu(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
inline double silu(double x) { return x / (1.0 + std::exp(-x)); }

inline Vec softmax(const Vec& x, int64_t n, int64_t v) {
  Vec y(n * v);
  for (int64_t r = 0; r < n; ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t i = 0; i < v; ++i) mx = std::max(mx, x[r * v + i]);
    for (int64_t i = 0; i < v; ++i) s += std::exp(x[r * v + i] - mx);
    for (int64_t i = 0; i < v; ++i) y[r * v + i] = std::exp(x[r * v + i] - mx) / s;
  }
  return y;
}

// Mean cross-entropy over rows whose target is not ignore_index.
inline double cross_entropy(const Vec& logits, const std::vector<int64_t>& targets, int64_t n,
                            int64_t v, int64_t ignore_index) {
  double total = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (targets[r] == ignore_index) continue;
    double mx = -INFINITY, s = 0;
    for (int64_t i = 0; i < v; ++i) mx = std::max(mx, logits[r * v + i]);
    for (int64_t i = 0; i < v; ++i) s += std::exp(logits[r * v + i] - mx);
    total += mx + std::log(s) - logits[r * v + targets[r]];
    ++count;
  }
  return count ? total / count : 0.0;
}

// x [B,T,H,Dh], pos [B,T]: pairs (i, i + Dh/2) rotated by pos * theta^(-2i/Dh).
inline Vec rope(const Vec& x, const std::vector<int64_t>& pos, int64_t b, int64_t t, int64_t h,
                int64_t dh, double theta) {
  Vec y(x.size());
  const int64_t half = dh / 2;
  for (int64_t bt = 0; bt < b * t; ++bt)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t i = 0; i < half; ++i) {
        const double a = pos[bt] * std::pow(theta, -2.0 * i / dh);
        const int64_t o = (bt * h + hh) * dh;
        y[o + i] = x[o + i] * std::cos(a) - x[o + i + half] * std::sin(a);
        y[o + i + half] = x[o + i] * std::sin(a) + x[o + i + half] * std::cos(a);
      }
  return y;
}

// softmax(q k^T / sqrt(Dh) + mask) v with mask k_pos[j] <= q_pos[i]; q [B,T,H,Dh], k,v [B,S,H,Dh].
inline Vec attention(const Vec& q, const Vec& k, const Vec& v, const std::vector<int64_t>& q_pos,
                     const std::vector<int64_t>& k_pos, int64_t b, int64_t t, int64_t s,
                     int64_t h, int64_t dh) {
  Vec out(b * t * h * dh, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t hh = 0; hh < h; ++hh)
      for (int64_t i = 0; i < t; ++i) {
        Vec score(s, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < s; ++j) {
          if (k_pos[bb * s + j] > q_pos[bb * t + i]) continue;
          double d = 0;
          for (int64_t e = 0; e < dh; ++e)
            d += q[((bb * t + i) * h + hh) * dh + e] * k[((bb * s + j) * h + hh) * dh + e];
          score[j] = d * scale;
          mx = std::max(mx, score[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < s; ++j) z += std::isinf(score[j]) ? 0.0 : std::exp(score[j] - mx);
        for (int64_t j = 0; j < s; ++j) {
          if (std::isinf(score[j])) continue;
          const double p = std::exp(score[j] - mx) / z;
          for (int64_t e = 0; e < dh; ++e)
            out[((bb * t + i) * h + hh) * dh + e] += p * v[((bb * s + j) * h + hh) * dh + e];
        }
      }
  return out;
}

// x [B,T,D], idx [B,C] -> [B,C,D]
inline Vec gather_rows(const Vec& x, const std::vector<int64_t>& idx, int64_t b, int64_t t,
                       int64_t c, int64_t d) {
  Vec out(b * c * d);
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t cc = 0; cc < c; ++cc)
      for (int64_t e = 0; e < d; ++e)
        out[(bb * c + cc) * d + e] = x[(bb * t + idx[bb * c + cc]) * d + e];
  return out;
}

// x [B,T,D] with src [B,C,D] added at rows idx [B,C].
inline Vec scatter_add_rows(Vec x, const std::vector<int64_t>& idx, const Vec& src, int64_t b,
                            int64_t t, int64_t c, int64_t d) {
  for (int64_t bb = 0; bb < b; ++bb)
    for (int64_t cc = 0; cc < c; ++cc)
      for (int64_t e = 0; e < d; ++e)
        x[(bb * t + idx[bb * c + cc]) * d + e] += src[(bb * c + cc) * d + e];
  return x;
}

// The k best positions of one row (score descending, then position ascending), ascending.
inline std::vector<int64_t> topk_row(const Vec& scores, int64_t k) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

inline double bce_with_logits(const Vec& x, const Vec& t) {
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double p = 1.0 / (1.0 + std::exp(-x[i]));
    s += -(t[i] * std::log(p) + (1 - t[i]) * std::log(1 - p));
  }
  return s / x.size();
}

}  // namespace mod::reference
