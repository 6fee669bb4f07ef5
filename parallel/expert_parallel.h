// Expert-parallel collectives as an autograd pair (Megatron-LM's dispatch/combine). Each is an
// op in the catalogue (core/op_catalogue.h, collective = true); each backward is the other's forward.
//
// Shapes: E experts (global, expert-major), S slots per expert (fixed, data-independent), D width;
// ep ranks keep E/ep consecutive experts each; tp ranks hold bitwise-identical x.
//
//   op                     forward                              in -> out
//   dispatch_to_experts    keep own tp share of slots, all-to-all   [E, S, D] -> [E/ep, ep*S/tp, D]
//   combine_from_experts   all-to-all back, all-gather tp shares    [E/ep, ep*S/tp, D] -> [E, S, D]
//
// dispatch: tp rank t keeps slots [t*S/tp, (t+1)*S/tp) of every expert (de-duplication, so each
// token slot is computed once per tp group); an all-to-all over ep sends experts
// [j*E/ep, (j+1)*E/ep) to ep rank j. Output row order per local expert is source-major: the
// slots from ep rank 0, then from ep rank 1, ... Backward: the inverse all-to-all, then an
// all-gather of the tp shares along the slots (as scatter_to_tp's backward).
//
// Message sizes depend only on shapes: one all_to_all over ep per call, chunks of
// (E/ep) * (S/tp) * D elements, no counts exchanged. With ep and tp both of size one the ops are
// copies (still recorded, so the gradient checks cover them).
#pragma once

#include "core/tensor.h"
#include "parallel/communicator.h"

namespace mod::parallel {

// x [E, S, D] (CPU, floating) -> [E/ep, ep * S/tp, D]. Throws std::invalid_argument naming the
// shape when x is not 3-D, E % ep != 0 or S % tp != 0.
Tensor dispatch_to_experts(const Tensor& x, Communicator& ep, Communicator& tp);
// y [E/ep, ep * S/tp, D] -> [E, S, D] with E = ep * y.size(0) and S = tp * y.size(1) / ep.
// Throws when y is not 3-D or y.size(1) % ep != 0.
Tensor combine_from_experts(const Tensor& y, Communicator& ep, Communicator& tp);

}  // namespace mod::parallel
