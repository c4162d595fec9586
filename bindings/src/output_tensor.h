// The runtime-allocated result of allgather, alltoall and reducescatter,
// handed to Python without a copy: through the buffer protocol (numpy) and
// DLPack (torch.from_dlpack, numpy.from_dlpack). Each export holds a copy of
// the gyre::Handle, whose shared state owns the bytes, so the memory lives
// as long as any array or tensor made from it.
//
// Threads: created and exported on a Python thread after the operation
// completed; the DLPack deleter may run on any thread and needs no GIL.
#pragma once

#include <pybind11/pybind11.h>

#include "gyre/gyre.h"

namespace gyre::python {

namespace py = pybind11;

class OutputTensor {
 public:
  explicit OutputTensor(Handle handle) : handle_(std::move(handle)) {}

  const OwnedTensor& tensor() const { return handle_.output(); }
  // An unused "dltensor" capsule (DLPack 0.6) viewing the output.
  py::capsule to_dlpack() const;
  py::buffer_info buffer() const;

 private:
  Handle handle_;
};

void bind_output_tensor(py::module_& m);

}  // namespace gyre::python
