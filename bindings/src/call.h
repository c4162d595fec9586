// One binding call's tensors, for module.cc's functions.
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "gyre/gyre.h"
#include "pending_op.h"
#include "tensor_import.h"

namespace gyre::python {

namespace py = pybind11;

// The tensors of one call, converted: imported views, or, when the Python
// layer could not convert an argument (`refusal` non-empty), views that
// carry its reason. Either way the runtime sees the call, so a refusal is
// decided and announced to the other ranks in one place (operations.cc).
class Call {
 public:
  explicit Call(std::string refusal) : refusal_(std::move(refusal)) { drain_graveyard(); }

  TensorView view(py::handle obj, const std::string& role, Access access) {
    auto t = refusal_.empty() ? ImportedTensor::convert(obj, role, access)
                              : ImportedTensor::refused(refusal_);
    // Staged copies hide where the tensors lie (tensor_import.h); a new
    // output (kWriteNew) is never staged.
    if (access == Access::kWrite) {
      for (auto& earlier : keep_) t->share_staging_with(*earlier);
    }
    keep_.push_back(std::move(t));
    return keep_.back()->view();
  }

  // The Python op as a ReduceOp; the runtime judges values it does not know.
  ReduceOp op(int value) {
    if (value < 0 || value > 255) {
      if (refusal_.empty()) refusal_ = "unknown reduction op " + std::to_string(value);
      return ReduceOp::kSum;
    }
    return static_cast<ReduceOp>(value);
  }

  // Enqueues with the GIL released; the views stay alive until completion.
  std::shared_ptr<PendingOp> start(const std::function<Handle()>& enqueue) {
    return PendingOp::start(std::move(keep_), enqueue);
  }

 private:
  std::string refusal_;
  Imports keep_;
};

}  // namespace gyre::python
