// Every differentiable op modtrain has, one header per family.
#pragma once

#include "core/autograd.h"
#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/elementwise.h"
#include "core/ops/decode.h"
#include "core/ops/embedding.h"
#include "core/ops/loss.h"
#include "core/ops/matmul.h"
#include "core/ops/mlp.h"
#include "core/ops/norm.h"
#include "core/ops/optim.h"
#include "core/ops/reduce.h"
#include "core/ops/rope.h"
#include "core/ops/routing.h"
#include "core/ops/softmax.h"
#include "core/tensor.h"
