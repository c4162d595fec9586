// The interface between gyre._gyre and the optional module
// gyre._torch_memory (torch_memory.cc), passed as a PyCapsule named
// kTorchMemoryCapsule: the one part of the extension compiled against
// torch's headers, and built only where torch was installed at build time.
//
// What it does: keeps the memory of a CPU torch storage alive while an
// operation reads and writes it, whatever the caller does to the storage
// meanwhile. torch's resize_() (and UntypedStorage.resize_(), share_memory_(),
// an out= argument of the wrong size) replace a storage's memory in place
// and free the old memory at once, whatever else holds the storage object.
// pin() therefore replaces the storage's DataPtr by one with the same address
// whose deleter only drops a reference: the old memory is freed when both the
// storage has let go of it and every operation that pinned it has ended.
// unpin() puts the original DataPtr back when the storage still holds the
// replacement and no other operation pins it, so a storage the caller left
// alone ends exactly as it began.
//
// Both functions run on a Python thread holding the GIL (as torch's own
// storage mutations from Python do). The memory itself may be read and
// written by any thread between the two.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>

namespace gyre::python {

inline constexpr const char* kTorchMemoryCapsule = "gyre._torch_memory.api";
inline constexpr int kTorchMemoryApiVersion = 3;

// What a plain CPU tensor's c10::TensorImpl says, read in C++ instead of
// through a dozen Python accessors (is_cpu, layout, dtype, is_contiguous,
// is_neg, shape, data_ptr(), untyped_storage() and the storage's own).
struct TorchTensorFacts {
  int scalar_type = -1;  // c10::ScalarType's value
  bool contiguous = false;
  bool negative = false;  // the negative bit (a view holding the values unsigned)
  int ndim = 0;
  const std::int64_t* sizes = nullptr;  // ndim of them; valid until the tensor changes
  void* data = nullptr;                 // the first element
  void* storage = nullptr;              // its c10::StorageImpl, for pin_storage()
  const void* storage_base = nullptr;   // the storage's memory
  std::size_t storage_nbytes = 0;
};

// c10::ScalarType values of the dtypes gyre takes (c10/core/ScalarType.h).
inline constexpr int kTorchUInt8 = 0, kTorchInt8 = 1, kTorchInt16 = 2, kTorchInt32 = 3,
                     kTorchInt64 = 4, kTorchFloat16 = 5, kTorchFloat32 = 6, kTorchFloat64 = 7,
                     kTorchBool = 11, kTorchBFloat16 = 15;

struct TorchMemoryApi {
  int version;  // kTorchMemoryApiVersion
  // torch.__version__ of the headers the module was compiled against; the
  // layout of torch's storage is only known to be this one for that version.
  const char* torch_version;
  // `storage`: a torch.UntypedStorage. Returns a token for unpin(), or
  // nullptr when this storage's memory cannot be pinned (not CPU memory, a
  // copy-on-write storage, no memory): the caller then copies instead. Never
  // raises.
  void* (*pin)(PyObject* storage);
  void (*unpin)(void* token);
  // `tensor`: a torch.Tensor or torch.nn.Parameter (exactly: the caller
  // checks). Fills `out` and returns true for a dense strided CPU tensor
  // with storage whose memory may be read and written in place (not
  // copy-on-write); false otherwise, when the caller asks Python instead.
  // Never raises.
  bool (*read_tensor)(PyObject* tensor, TorchTensorFacts* out);
  // pin() for the StorageImpl read_tensor reported.
  void* (*pin_storage)(void* storage_impl);
  // The same for a storage whose memory was lent by another owner, which
  // the caller has found to be a buffer of gyre::alloc_shared (a tensor of
  // gyre.torch.empty_shared, made by torch.frombuffer): pin_storage leaves
  // such memory to be copied.
  void* (*pin_storage_lent)(void* storage_impl);
};

}  // namespace gyre::python
