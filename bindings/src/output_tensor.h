// The runtime-allocated result of allgather, alltoall and reducescatter,
// handed to Python without a copy: through the buffer protocol (numpy) and
// DLPack (torch.from_dlpack, numpy.from_dlpack). Each export holds a copy of
// the gyre::Handle, whose shared state owns the bytes (or of the pooled
// block, for the new output of an out-of-place allreduce), so the memory
// lives as long as any array or tensor made from it.
//
// Threads: created and exported on a Python thread after the operation
// completed; the DLPack deleter may run on any thread and needs no GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "gyre/gyre.h"

namespace gyre::python {

namespace py = pybind11;

class OutputTensor {
 public:
  explicit OutputTensor(Handle handle) : handle_(std::move(handle)) {}
  // A block of the output pool (host_pool.h) holding `shape` of `dtype`:
  // the new output of an out-of-place allreduce.
  OutputTensor(std::shared_ptr<std::byte> block, DataType dtype, std::vector<std::int64_t> shape)
      : block_(std::move(block)), dtype_(dtype), shape_(std::move(shape)) {}

  DataType dtype() const { return block_ ? dtype_ : handle_.output().dtype; }
  const std::vector<std::int64_t>& shape() const {
    return block_ ? shape_ : handle_.output().shape;
  }
  void* data() const;
  // An unused "dltensor" capsule (DLPack 0.6) viewing the output.
  py::capsule to_dlpack() const;
  py::buffer_info buffer() const;

 private:
  Handle handle_;                     // owns the bytes of a runtime output
  std::shared_ptr<std::byte> block_;  // or a pooled block
  DataType dtype_ = DataType::kFloat32;
  std::vector<std::int64_t> shape_;
};

void bind_output_tensor(py::module_& m);

}  // namespace gyre::python
