// The training modes' shared argument checks (training_checks.h).
#include "training_checks.h"

#include <cmath>

#include <fmt/format.h>

namespace gyre::training_detail {

void check_outer_optimizer(const OuterOptimizer& o, const std::string& who) {
  auto bad = [&](const std::string& what) { throw InvalidArgument(who + ": " + what); };
  if (!(std::isfinite(o.lr) && o.lr > 0)) {
    bad(fmt::format("the outer optimizer's lr must be positive and finite, got {}", o.lr));
  }
  if (!(o.momentum >= 0 && o.momentum < 1)) {
    bad(fmt::format("the outer optimizer's momentum must be in [0, 1), got {}", o.momentum));
  }
  if (o.nesterov && o.momentum == 0) {
    bad("the outer optimizer's Nesterov correction needs a momentum above 0");
  }
}

void check_params(const std::vector<TensorView>& params, const std::string& who) {
  auto bad = [&](std::size_t i, const std::string& what) {
    throw InvalidArgument(fmt::format("{}: parameter {} {}", who, i, what));
  };
  if (params.empty()) throw InvalidArgument(who + ": no parameters given");
  for (std::size_t i = 0; i < params.size(); ++i) {
    const TensorView& p = params[i];
    if (!p.refusal.empty()) bad(i, fmt::format("cannot be taken: {}", p.refusal));
    if (p.dtype != DataType::kFloat32 && p.dtype != DataType::kFloat64) {
      bad(i, fmt::format("has dtype {}; {} takes float32 and float64 parameters",
                         dtype_name(p.dtype), who));
    }
    if (p.device.type != DeviceType::kCPU) {
      bad(i, fmt::format("is on {}; {} takes host parameters", device_name(p.device.type), who));
    }
    for (auto d : p.shape) {
      if (d < 0) bad(i, fmt::format("has a negative dimension ({})", d));
    }
    if (p.data == nullptr && p.numel() > 0) bad(i, "has a null buffer");
    for (std::size_t j = 0; j < i; ++j) {
      if (p.data != nullptr && p.data == params[j].data) {
        bad(i, fmt::format("is the same buffer as parameter {}", j));
      }
    }
  }
}

}  // namespace gyre::training_detail
