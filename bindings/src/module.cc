// The extension module gyre._gyre: type conversion and GIL handling around
// the C++ API, nothing more. Argument defaults, generated names, framework
// conversions and the Horovod-style API live in the Python package.
//
// Threads: every function is called from Python threads with the GIL held;
// each releases it around any call that can block on the runtime.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <utility>
#include <vector>

#include "exceptions.h"
#include "gyre/gyre.h"
#include "output_tensor.h"
#include "pending_op.h"
#include "tensor_import.h"

namespace py = pybind11;

namespace gyre::python {
namespace {

ReduceOp to_op(int op) {
  if (op < 0 || op >= kNumReduceOps) {
    throw InvalidArgument("unknown reduction op " + std::to_string(op) +
                          " (expected gyre.Average, Sum, Min, Max or Product)");
  }
  return static_cast<ReduceOp>(op);
}

std::unique_ptr<ImportedTensor> import(py::handle obj, const std::string& name, Access access) {
  return ImportedTensor::from_object(obj, name, access);
}

// Refused here, before enqueueing, so that no other rank waits on it.
void check_op_defined(const std::string& name, const TensorView& v, ReduceOp op) {
  if (!op_defined(v.dtype, op)) {
    throw InvalidArgument("tensor '" + name + "': reduce op " + std::string(op_name(op)) +
                          " is not defined for " + std::string(dtype_name(v.dtype)) +
                          " (average needs a floating type; use gyre.Sum)");
  }
}

// Runs f with the GIL released after destroying finished operations' tensors.
template <typename F>
auto blocking(F&& f) {
  drain_graveyard();
  py::gil_scoped_release release;
  return f();
}

std::shared_ptr<PendingOp> allreduce(const std::string& name, py::handle in, py::handle out, int op,
                                     double pre, double post) {
  drain_graveyard();
  const ReduceOp rop = to_op(op);
  Imports keep;
  keep.push_back(import(in, name, out.is_none() ? Access::kWrite : Access::kRead));
  TensorView vin = keep.back()->view();
  check_op_defined(name, vin, rop);
  TensorView vout = vin;
  if (!out.is_none()) {
    keep.push_back(import(out, name, Access::kWrite));
    vout = keep.back()->view();
  }
  return PendingOp::start(std::move(keep),
                          [&] { return allreduce_async(name, vin, vout, rop, pre, post); });
}

std::shared_ptr<PendingOp> grouped_allreduce(const std::vector<std::string>& names,
                                             const py::sequence& ins, py::handle outs, int op,
                                             double pre, double post) {
  drain_graveyard();
  const ReduceOp rop = to_op(op);
  if (names.size() != static_cast<std::size_t>(py::len(ins))) {
    throw InvalidArgument("grouped_allreduce: " + std::to_string(names.size()) + " names for " +
                          std::to_string(py::len(ins)) + " tensors");
  }
  const bool in_place = outs.is_none();
  if (!in_place && py::len(outs) != py::len(ins)) {
    throw InvalidArgument("grouped_allreduce: as many outputs as inputs are needed");
  }
  const auto out_seq = in_place ? py::sequence() : py::reinterpret_borrow<py::sequence>(outs);
  Imports keep;
  std::vector<TensorView> vins, vouts;
  for (std::size_t i = 0; i < names.size(); ++i) {
    keep.push_back(import(ins[i], names[i], in_place ? Access::kWrite : Access::kRead));
    vins.push_back(keep.back()->view());
    check_op_defined(names[i], vins.back(), rop);
    if (!in_place) {
      keep.push_back(import(out_seq[i], names[i], Access::kWrite));
    }
    vouts.push_back(keep.back()->view());
  }
  return PendingOp::start(std::move(keep), [&] {
    return grouped_allreduce_async(names, vins, vouts, rop, pre, post);
  });
}

std::vector<NamedBuffer> import_named(const std::vector<std::pair<std::string, py::object>>& items,
                                      Access access, Imports& keep) {
  std::vector<NamedBuffer> buffers;
  for (const auto& [name, obj] : items) {
    keep.push_back(import(obj, name, access));
    buffers.push_back(NamedBuffer{name, keep.back()->view()});
  }
  return buffers;
}

void bind_operations(py::module_& m) {
  m.def("allreduce", &allreduce, py::arg("name"), py::arg("input"), py::arg("output"),
        py::arg("op"), py::arg("prescale"), py::arg("postscale"),
        "Enqueues an allreduce; output=None reduces in place.");
  m.def("grouped_allreduce", &grouped_allreduce, py::arg("names"), py::arg("inputs"),
        py::arg("outputs"), py::arg("op"), py::arg("prescale"), py::arg("postscale"));
  m.def(
      "allgather",
      [](const std::string& name, py::handle in) {
        drain_graveyard();
        Imports keep;
        keep.push_back(import(in, name, Access::kRead));
        TensorView v = keep.back()->view();
        return PendingOp::start(std::move(keep), [&] { return allgather_async(name, v); });
      },
      py::arg("name"), py::arg("input"));
  m.def(
      "broadcast",
      [](const std::string& name, py::handle buf, int root) {
        drain_graveyard();
        Imports keep;
        keep.push_back(import(buf, name, Access::kWrite));
        TensorView v = keep.back()->view();
        return PendingOp::start(std::move(keep), [&] { return broadcast_async(name, v, root); });
      },
      py::arg("name"), py::arg("buffer"), py::arg("root"));
  m.def(
      "alltoall",
      [](const std::string& name, py::handle in, const std::vector<std::int64_t>& splits) {
        drain_graveyard();
        Imports keep;
        keep.push_back(import(in, name, Access::kRead));
        TensorView v = keep.back()->view();
        return PendingOp::start(std::move(keep),
                                [&] { return alltoall_async(name, v, splits); });
      },
      py::arg("name"), py::arg("input"), py::arg("splits"));
  m.def(
      "reducescatter",
      [](const std::string& name, py::handle in, int op, double pre, double post) {
        drain_graveyard();
        const ReduceOp rop = to_op(op);
        Imports keep;
        keep.push_back(import(in, name, Access::kRead));
        TensorView v = keep.back()->view();
        check_op_defined(name, v, rop);
        return PendingOp::start(std::move(keep), [&] {
          return reducescatter_async(name, v, rop, pre, post);
        });
      },
      py::arg("name"), py::arg("input"), py::arg("op"), py::arg("prescale"),
      py::arg("postscale"));
}

void bind_divergence(py::module_& m) {
  m.def("commit_step", [] { blocking([] { commit_step(); }); });
  m.def("committed_steps", [] { return blocking([] { return committed_steps(); }); });
  m.def("version_vector", [] { return blocking([] { return version_vector(); }); });
  m.def(
      "fingerprint_check",
      [](const std::vector<std::pair<std::string, py::object>>& items) {
        drain_graveyard();
        Imports keep;
        auto buffers = import_named(items, Access::kRead, keep);
        std::vector<FingerprintMismatch> result;
        {
          py::gil_scoped_release release;
          result = fingerprint_check(buffers);
        }
        py::list out;
        for (const auto& mm : result) out.append(py::make_tuple(mm.name, mm.groups));
        return out;
      },
      py::arg("buffers"),
      "[(name, tensor)] -> [(name, [(digest, [ranks])])] for the buffers that differ.");
  m.def(
      "resync",
      [](const std::vector<std::pair<std::string, py::object>>& items, const std::string& policy) {
        drain_graveyard();
        ResyncPolicy p;
        if (policy == "newest") {
          p = ResyncPolicy::kNewest;
        } else if (policy == "average") {
          p = ResyncPolicy::kAverage;
        } else {
          throw InvalidArgument("resync: unknown policy '" + policy +
                                "' (expected 'newest' or 'average')");
        }
        Imports keep;
        auto buffers = import_named(items, Access::kWrite, keep);
        py::gil_scoped_release release;
        resync(buffers, p);
      },
      py::arg("buffers"), py::arg("policy"));
}

}  // namespace
}  // namespace gyre::python

PYBIND11_MODULE(_gyre, m) {
  using namespace gyre::python;
  m.doc() = "gyre's C++ runtime; use the gyre and gyre.torch packages instead.";
  register_translator();
  m.def("_set_exception_classes", &set_exception_classes);
  bind_output_tensor(m);

  py::class_<PendingOp, std::shared_ptr<PendingOp>>(m, "PendingOp")
      .def("poll",
           [](const PendingOp& op) {
             drain_graveyard();
             return op.poll();
           })
      .def("wait", &PendingOp::wait)
      .def("output", [](const PendingOp& op) { return OutputTensor(op.handle()); })
      .def("received_splits",
           [](const PendingOp& op) { return op.handle().received_splits(); });

  m.attr("built_with_nccl") = gyre::nccl_built();
  m.def("init", [] { blocking([] { gyre::init(); }); });
  m.def("shutdown", [] {
    blocking([] { gyre::shutdown(); });
    drain_graveyard();
  });
  m.def("is_initialized", [] { return gyre::is_initialized(); });
  m.def("rank", [] { return gyre::rank(); });
  m.def("size", [] { return gyre::size(); });
  m.def("local_rank", [] { return gyre::local_rank(); });
  m.def("local_size", [] { return gyre::local_size(); });
  m.def("barrier", [] { blocking([] { gyre::barrier(); }); });
  m.def("join", [] { return blocking([] { return gyre::join(); }); });
  bind_operations(m);
  bind_divergence(m);
}
