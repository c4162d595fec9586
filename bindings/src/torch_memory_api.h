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

namespace gyre::python {

inline constexpr const char* kTorchMemoryCapsule = "gyre._torch_memory.api";
inline constexpr int kTorchMemoryApiVersion = 1;

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
};

}  // namespace gyre::python
