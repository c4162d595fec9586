// Turning Python tensors into gyre::TensorView without copying, and keeping
// them alive while an operation uses their memory.
//
// Three routes, tried in this order:
//   - torch's own accessors, for a torch.Tensor or nn.Parameter in CPU
//     memory that is strided, contiguous and of a dtype gyre takes (what
//     training code passes): data_ptr(), shape and dtype cost tens of
//     nanoseconds each, where a DLPack export costs tens of microseconds
//     (torch's __dlpack__ and __dlpack_device__ are Python code). The import
//     holds the tensor's storage (untyped_storage()), which keeps the memory
//     alive even if the caller's tensor is given another storage (set_(),
//     .data =) while the operation is in flight. torch is never imported
//     here: its types are looked up once the caller has imported it.
//   - DLPack: the object has __dlpack__/__dlpack_device__ (other torch
//     tensors, numpy arrays, any DLPack producer). A torch tensor is
//     detached first (torch refuses to export one that requires grad; the
//     capsule then holds an alias nobody else can touch, with the same
//     storage). The unversioned "dltensor" capsule is requested and renamed
//     "used_dltensor"; the DLManagedTensor is then ours and its deleter runs
//     when the ImportedTensor is destroyed.
//   - The buffer protocol (numpy arrays that refuse DLPack export, e.g.
//     read-only ones, bytearray, array.array, memoryview).
//
// A torch tensor with the negative bit set (a lazy negation view,
// torch._neg_view) is refused on every route: its memory holds the values
// without the sign, and DLPack exports it without a word.
//
// Threads: from_object() and the destructor run on a Python thread holding the
// GIL (the producer's deleter or PyBuffer_Release may touch Python objects).
// The TensorView may be read from any thread while the object is alive.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "gyre/gyre.h"

struct DLManagedTensor;

namespace gyre::python {

namespace py = pybind11;

// Whether the operation writes into the tensor (in-place collectives,
// outputs): a read-only buffer is refused for those.
enum class Access { kRead, kWrite };

class ImportedTensor {
 public:
  // Converts `obj`. Anything gyre cannot convert (not a tensor, a device it
  // cannot reach, not contiguous, vector lanes, a dtype gyre has no DataType
  // for, read-only for kWrite, a producer that raises) does not throw: the
  // view carries the reason as TensorView::refusal, a clause starting with
  // `name` (what messages call the tensor: "input", "buffer 'w'"), and the
  // runtime refuses the operation with it and announces the refusal to the
  // other ranks. Python errors other than Exception subclasses propagate.
  static std::unique_ptr<ImportedTensor> convert(py::handle obj, const std::string& name,
                                                 Access access);
  // A tensor that was not converted: the view holds only `refusal`.
  static std::unique_ptr<ImportedTensor> refused(std::string refusal);

  ImportedTensor(const ImportedTensor&) = delete;
  ImportedTensor& operator=(const ImportedTensor&) = delete;
  ~ImportedTensor();  // GIL held: see the file comment

  const TensorView& view() const { return view_; }

 private:
  ImportedTensor() = default;
  // convert() without the catching: throws gyre::InvalidArgument.
  static std::unique_ptr<ImportedTensor> from_object(py::handle obj, const std::string& name,
                                                     Access access);
  // The torch route; false (and nothing set) when `obj` does not qualify.
  bool import_torch(py::handle obj, const std::string& name);
  // cuda: the producer is on a CUDA device (builds with NCCL only).
  void import_dlpack(py::handle obj, const std::string& name, bool cuda);
  // Returns false (and sets nothing) if obj does not support the protocol.
  bool import_buffer(py::handle obj, const std::string& name, Access access);

  TensorView view_;
  py::object storage_;                  // the torch route: the tensor's storage
  DLManagedTensor* managed_ = nullptr;  // owned once the capsule is renamed
  Py_buffer buffer_{};
  bool has_buffer_ = false;
};

}  // namespace gyre::python
