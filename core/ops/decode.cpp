// Batched decoding's ops (see decode.h): shape and dtype checks, then one backend kernel each.
// None records an autograd node: decoding runs under NoGradGuard and has no backward.
#include "core/ops/decode.h"

#include <string>

#include "core/ops/check.h"

namespace mod {

namespace {
// An i64 flag, length or position vector with n entries on `like`'s device.
void check_vector(const char* op, const Tensor& t, int64_t n, const Tensor& like, const char* arg) {
  check::defined(op, t, arg);
  if (t.dtype() != DType::I64 || t.numel() != n)
    check::fail(op, std::string(arg) + " " + describe(t) + " must be i64 with " +
                        std::to_string(n) + " entries (one per sequence)");
  check::same_device(op, t, arg, like, "the batch");
}

// k_cache, v_cache [B,S,H,Dh] alike; returns nothing, fails naming both.
void check_caches(const char* op, const Tensor& kc, const Tensor& vc) {
  check::floating(op, kc, "k_cache");
  check::dim(op, kc, 4, "k_cache");
  check::same_shape(op, kc, "k_cache", vc, "v_cache");
  check::same_dtype_device(op, kc, "k_cache", vc, "v_cache");
}

// x [N,1,H,Dh] (one token per row) matching the caches' H, Dh, dtype and device, with N = B or,
// given rows, N = rows' entries (i64 on the caches' device).
void check_token_rows(const char* op, const Tensor& x, const char* arg, const Tensor& kc,
                      const Tensor& rows) {
  check::dim(op, x, 4, arg);
  const int64_t n = rows.defined() ? rows.numel() : kc.size(0);
  if (x.size(0) != n || x.size(1) != 1 || x.size(2) != kc.size(2) || x.size(3) != kc.size(3))
    check::fail(op, std::string(arg) + " " + shape_str(x.shape()) + " must be [N,1,H,Dh] with " +
                        "H, Dh of k_cache " + shape_str(kc.shape()) + " and N = " +
                        std::to_string(n) + (rows.defined() ? " (rows)" : " (B)"));
  check::same_dtype_device(op, x, arg, kc, "k_cache");
  if (rows.defined()) {
    check_vector(op, rows, n, kc, "rows");
    check::indices_in_range(op, rows, kc.size(0), "rows");
  }
}
}  // namespace

Tensor decode_admit(const Tensor& decision, const Tensor& active) {
  check::floating("decode_admit", decision, "decision");
  const int64_t b = decision.numel();
  check_vector("decode_admit", active, b, decision, "active");
  Tensor admit = Tensor::empty({b}, DType::I64, decision.device());
  backend_of(decision).decode_admit(decision, active, admit);
  return admit;
}

void kv_cache_append(const Tensor& k, const Tensor& v, const Tensor& admit, Tensor& len,
                     Tensor& k_cache, Tensor& v_cache, const Tensor& rows) {
  const char* op = "kv_cache_append";
  check_caches(op, k_cache, v_cache);
  check_token_rows(op, k, "k", k_cache, rows);
  check_token_rows(op, v, "v", k_cache, rows);
  if (admit.defined()) check_vector(op, admit, k.size(0), k_cache, "admit");
  check_vector(op, len, k_cache.size(0), k_cache, "len");
  backend_of(k_cache).kv_cache_append(k, v, admit, rows, len, k_cache, v_cache);
}

Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& len, const Tensor& rows) {
  const char* op = "decode_attention";
  check_caches(op, k_cache, v_cache);
  check_token_rows(op, q, "q", k_cache, rows);
  check_vector(op, len, k_cache.size(0), k_cache, "len");
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor out_3 = out.view({q.size(0), q.size(2), q.size(3)});
  backend_of(q).decode_attention(q.view({q.size(0), q.size(2), q.size(3)}), k_cache, v_cache, len,
                                 rows, out_3);
  return out;
}

Tensor masked_add(const Tensor& x, const Tensor& u, const Tensor& admit) {
  const char* op = "masked_add";
  check::floating(op, x, "x");
  check::same_shape(op, x, "x", u, "u");
  check::same_dtype_device(op, x, "x", u, "u");
  if (x.dim() < 1 || x.numel() == 0) check::fail(op, "x " + describe(x) + " must be [B,...]");
  check_vector(op, admit, x.size(0), x, "admit");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_of(x).masked_add(x, u, admit, out);
  return out;
}

Tensor sample_tokens(const Tensor& logits, const Tensor& pos, const SampleArgs& args) {
  const char* op = "sample_tokens";
  check::floating(op, logits, "logits");
  check::dim(op, logits, 2, "logits");
  if (logits.size(1) < 1) check::fail(op, "logits " + describe(logits) + " has no vocabulary");
  check_vector(op, pos, logits.size(0), logits, "pos");
  if (args.temperature > 0 && (args.top_k < 0 || !(args.top_p > 0 && args.top_p <= 1)))
    check::fail(op, "top_k " + std::to_string(args.top_k) + " must be >= 0 and top_p " +
                        std::to_string(args.top_p) + " in (0, 1]");
  Tensor next = Tensor::empty({logits.size(0)}, DType::I64, logits.device());
  backend_of(logits).sample_tokens(logits, pos, args, next);
  return next;
}

void decode_advance(const Tensor& next, const Tensor& prompt_len, const Tensor& stop, int64_t eot,
                    Tensor& tokens, Tensor& pos, Tensor& cur, Tensor& active) {
  const char* op = "decode_advance";
  check::dim(op, tokens, 2, "tokens");
  if (tokens.dtype() != DType::I64) check::fail(op, "tokens " + describe(tokens) + " must be i64");
  const int64_t b = tokens.size(0);
  check_vector(op, next, b, tokens, "next");
  check_vector(op, prompt_len, b, tokens, "prompt_len");
  check_vector(op, stop, b, tokens, "stop");
  check_vector(op, pos, b, tokens, "pos");
  check_vector(op, cur, b, tokens, "cur");
  check_vector(op, active, b, tokens, "active");
  backend_of(tokens).decode_advance(next, prompt_len, stop, eot, tokens, pos, cur, active);
}

}  // namespace mod
