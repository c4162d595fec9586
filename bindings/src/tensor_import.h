// Turning Python tensors into gyre::TensorView, and keeping them alive while
// an operation uses their memory.
//
// Three routes, tried in this order:
//   - torch's own accessors, for a torch.Tensor or nn.Parameter in CPU
//     memory that is strided, contiguous and of a dtype gyre takes (what
//     training code passes): data_ptr(), shape and dtype cost tens of
//     nanoseconds each, where a DLPack export costs tens of microseconds
//     (torch's __dlpack__ and __dlpack_device__ are Python code). torch is
//     never imported here: its types are looked up once the caller has
//     imported it.
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
// torch tensors in CPU memory (either of the first two routes) need more
// than a reference: torch's resize_() (and UntypedStorage.resize_(),
// share_memory_(), an out= argument of the wrong size) replaces the storage's
// memory in place and frees the old memory at once, whatever else holds the
// storage. Two ways, chosen once per process (torch_in_flight_mode()):
//   - pin (where gyre._torch_memory was built for the installed torch):
//     the storage's memory is pinned at the call (torch_memory_api.h) and
//     the runtime works in it; the old memory outlives any replacement until
//     the operation ends. No copy.
//   - copy (otherwise, or GYRE_TORCH_IN_FLIGHT=copy): the values are copied,
//     when the operation is called (GIL held), into memory gyre owns, which
//     the runtime reads and writes, and an in-place result is copied back.
// Either way write_back(), on a Python thread with the GIL, checks that the
// tensor still has the memory and shape it had at the call, and otherwise
// reports it (the result went to the memory the tensor had). Whatever the
// caller does to the tensor in between (resize_, set_, del, .data =, a
// storage resize), the runtime never touches freed memory, and every other
// rank receives the values the memory held at the call (pinned: unless the
// caller wrote into that very memory in flight, as with any other backend).
// numpy arrays need neither (numpy refuses to resize an array that is
// exported); CUDA tensors are not staged (resizing one in flight is
// documented as forbidden).
//
// A torch tensor with the negative bit set (a lazy negation view,
// torch._neg_view) is refused on every route: its memory holds the values
// without the sign, and DLPack exports it without a word.
//
// Threads: from_object(), write_back() and the destructor run on a Python
// thread holding the GIL (the producer's deleter or PyBuffer_Release may
// touch Python objects). The TensorView may be read, and mark_completed()
// called, from any thread while the object is alive.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>

#include "gyre/gyre.h"

struct DLManagedTensor;

namespace gyre::python {

namespace py = pybind11;

// Whether the operation writes into the tensor (in-place collectives,
// outputs): a read-only buffer is refused for those.
// kWriteNew: an output made for this call (a new tensor for an out-of-place
// result) that nobody else holds until the operation completes: nothing can
// resize it in flight, so it is neither pinned nor copied, only kept alive.
enum class Access { kRead, kWrite, kWriteNew };

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

  // Whether the operation's result still has to be copied into the
  // caller's tensor (a staged tensor the operation writes).
  bool needs_write_back() const { return write_back_pending_; }
  // Called once the operation has completed (any thread, no GIL): `ok`
  // whether it succeeded. A result not written back by write_back() is
  // written back by the destructor if the operation succeeded.
  void mark_completed(bool ok) { succeeded_ = ok; }
  // Copies a staged result into the caller's tensor, if the tensor still
  // views the memory and shape it had at the call; otherwise returns why not
  // (a clause naming the tensor) and writes nothing. Once only; "" when
  // there is nothing to write. GIL held, operation completed successfully.
  std::string write_back();
  // Called for an import the operation writes with each earlier import of
  // the same call (the input of an out-of-place allreduce, say), since
  // staging hides from the runtime where the callers' tensors lie: if both
  // view the same memory, this one takes the earlier one's staged copy (the
  // runtime then sees the in-place operation it was given) and the earlier
  // one writes the result back; if they overlap partly, this view is refused,
  // as the runtime refuses partly overlapping input and output. GIL held.
  void share_staging_with(ImportedTensor& earlier);

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
  // Keeps a torch tensor's memory safe while in flight (see the file
  // comment): pinned, or copied into staging_ with the view pointed there;
  // kWriteNew: only kept alive. `tensor` is the caller's torch tensor.
  void stage(py::handle tensor, const std::string& name, Access access);

  TensorView view_;
  DLManagedTensor* managed_ = nullptr;  // owned once the capsule is renamed
  Py_buffer buffer_{};
  bool has_buffer_ = false;

  // Staging of a torch tensor in CPU memory (see the file comment): from
  // kPooledMinBytes up a block of host_pool.h, reused by the next call of
  // that size instead of mapped and faulted in again.
  std::shared_ptr<std::byte> staging_;
  // Or, where gyre._torch_memory serves this torch, the storage's memory
  // pinned instead (torch_memory_api.h): no copy; unpinned at destruction.
  void* pin_ = nullptr;
  void (*unpin_)(void*) = nullptr;
  // The tensor's c10::StorageImpl where import_torch read it in C++
  // (TorchMemoryApi::read_tensor): pinned without asking Python for it.
  void* storage_impl_ = nullptr;
  py::object tensor_;              // the caller's tensor: write_back(); kWriteNew: kept alive
  void* caller_data_ = nullptr;    // its memory at the call
  std::string name_;               // what messages call it
  bool write_back_pending_ = false;
  bool succeeded_ = false;         // mark_completed(true) was called
};

}  // namespace gyre::python
