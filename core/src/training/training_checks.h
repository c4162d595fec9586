// The argument checks LocalSgd and PartialLocalSgd share: the outer
// optimizer's settings and the parameters (float32/float64 host tensors,
// each buffer given once). Each throws InvalidArgument prefixed with `who`
// ("LocalSgd", "PartialLocalSgd"), naming the problem. Internal to
// core/src/training.
#pragma once

#include <string>
#include <vector>

#include "gyre/local_sgd.h"

namespace gyre::training_detail {

void check_outer_optimizer(const OuterOptimizer& o, const std::string& who);
void check_params(const std::vector<TensorView>& params, const std::string& who);

}  // namespace gyre::training_detail
