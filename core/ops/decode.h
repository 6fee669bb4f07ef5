// Batched one-token decoding with static KV caches (forward only: no gradients, no autograd
// nodes). Shape legend: B sequences, S cache slots, H heads, Dh head dim, W = H*Dh, V vocabulary,
// L token buffer length. Flags, lengths, positions and tokens are i64 [B] tensors on the device,
// so a step reads nothing back to the host and can be captured as a CUDA graph.
//   decode_admit(decision [B], active [B])            -> admit [B]: active and decision > 0
//   kv_cache_append(k, v [N,1,H,Dh], admit, len, kc, vc [B,S,H,Dh], rows)  slot len[b] <- row i
//                                                      of sequence b = rows[i] (or i), and
//                                                      len[b] += 1, where admitted, in place
//   decode_attention(q [N,1,H,Dh], kc, vc, len, rows) -> [N,1,H,Dh] over slots [0, len[b])
// rows (i64 [N], distinct) lets a step run only some sequences (the CPU's admitted ones);
// undefined, row i is sequence i and N = B.
//   masked_add(x, u [B,...], admit)                   -> x + u where admitted, else x
//   sample_tokens(logits [B,V], pos, args)            -> next [B] (SampleArgs, core/backend.h)
//   decode_advance(next, prompt_len, stop, eot, tokens [B,L], pos, cur, active)  in place
// Tested by: tests/core/decode_ops_test.cpp (against naive references, errors),
// tests/cuda/parity_decode_test.cpp (CUDA against CPU).
#pragma once

#include "core/backend.h"
#include "core/tensor.h"

namespace mod {

Tensor decode_admit(const Tensor& decision, const Tensor& active);
void kv_cache_append(const Tensor& k, const Tensor& v, const Tensor& admit, Tensor& len,
                     Tensor& k_cache, Tensor& v_cache, const Tensor& rows = Tensor());
Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& len, const Tensor& rows = Tensor());
Tensor masked_add(const Tensor& x, const Tensor& u, const Tensor& admit);
Tensor sample_tokens(const Tensor& logits, const Tensor& pos, const SampleArgs& args);
void decode_advance(const Tensor& next, const Tensor& prompt_len, const Tensor& stop, int64_t eot,
                    Tensor& tokens, Tensor& pos, Tensor& cur, Tensor& active);

}  // namespace mod
