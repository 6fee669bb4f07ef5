// The model's forward result (see forward_result.h).
#include "model/forward_result.h"

#include "core/all_ops.h"

namespace mod::model {

void ForwardResult::add_aux_loss(const Tensor& term) {
  aux_loss = aux_loss.defined() ? add(aux_loss, term) : term;
}

}  // namespace mod::model
