// gyre._torch_memory: pins the memory of CPU torch storages while an
// operation uses it (torch_memory_api.h says what and why). Compiled against
// the installed torch's headers and linked to its libc10; gyre._gyre uses it
// only when torch.__version__ is the one it was built for.
#include <Python.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/COW.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "torch_memory_api.h"

#ifndef GYRE_TORCH_VERSION
#error "GYRE_TORCH_VERSION: torch.__version__ of the headers, set by bindings/CMakeLists.txt"
#endif

namespace gyre::python {
namespace {

// The memory of one storage as it was when first pinned. References: one
// for the replacement DataPtr while a storage holds it, one per pin.
struct Hold {
  c10::DataPtr original;
  std::atomic<int> refs{0};
};

void unref(Hold* h) {
  if (h->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete h;  // frees the memory
}

// The deleter of the replacement DataPtr: runs when torch lets go of it (a
// resize, the storage's end) or when unpin() puts the original back; any thread.
void replacement_released(void* ctx) { unref(static_cast<Hold*>(ctx)); }

struct Pin {
  Hold* hold;
  c10::intrusive_ptr<c10::StorageImpl> storage;  // kept alive for unpin()
};

Hold* hold_of(const c10::DataPtr& p) {
  return p.get_deleter() == &replacement_released ? static_cast<Hold*>(p.get_context()) : nullptr;
}

// The address in a torch object's _cdata (a storage's c10::StorageImpl, a
// tensor's c10::TensorImpl); nullptr, with no Python error left, if none.
void* cdata_of(PyObject* obj) {
  PyObject* cdata = PyObject_GetAttrString(obj, "_cdata");
  if (cdata == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  void* p = PyLong_AsVoidPtr(cdata);
  Py_DECREF(cdata);
  if (p == nullptr) PyErr_Clear();
  return p;
}

c10::StorageImpl* storage_impl(PyObject* storage) {
  // torch.UntypedStorage._cdata: the address of its c10::StorageImpl.
  void* p = cdata_of(storage);
  return static_cast<c10::StorageImpl*>(p);
}

// `lent`: also memory another owner lent the storage (from_blob,
// torch.frombuffer), which the caller knows to be gyre's own (a buffer of
// gyre::alloc_shared): nothing in torch looks at such a storage's deleter
// while the operation runs.
void* pin_impl(c10::StorageImpl* s, bool lent) {
  try {
    if (s == nullptr) return nullptr;
    const c10::DataPtr& current = s->data_ptr();
    if (current.get() == nullptr || current.device().type() != c10::DeviceType::CPU) return nullptr;
    Hold* h = hold_of(current);
    if (h != nullptr) {
      h->refs.fetch_add(1, std::memory_order_relaxed);  // pinned already: one more pin
    } else {
      // Only memory of the CPU allocator, which nothing else identifies by
      // its deleter: shared memory (MapAllocator), pinned host memory (CUDA's
      // host allocator) and memory lent by another library (from_blob,
      // numpy) are found through the deleter and context by torch's own
      // code (is_shared(), a pinned copy's event), and copy-on-write storages
      // would be copied by set_data_ptr: those are copied instead.
      c10::Allocator* cpu = c10::GetCPUAllocator();
      const bool cpu_memory = cpu != nullptr && cpu->raw_deleter() != nullptr &&
                              current.get_deleter() == cpu->raw_deleter();
      if ((!cpu_memory && !lent) || c10::impl::cow::is_cow_data_ptr(current)) {
        return nullptr;
      }
      h = new Hold();
      h->refs.store(2, std::memory_order_relaxed);  // the replacement, this pin
      void* data = current.get();
      const c10::Device device = current.device();
      h->original = s->set_data_ptr(c10::DataPtr(data, h, &replacement_released, device));
    }
    return new Pin{h, c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s)};
  } catch (...) {
    return nullptr;
  }
}

void* pin(PyObject* storage) { return pin_impl(storage_impl(storage), false); }

void* pin_storage(void* storage_impl) {
  return pin_impl(static_cast<c10::StorageImpl*>(storage_impl), false);
}

void* pin_storage_lent(void* storage_impl) {
  return pin_impl(static_cast<c10::StorageImpl*>(storage_impl), true);
}

bool read_tensor(PyObject* tensor, TorchTensorFacts* out) {
  try {
    // torch.Tensor._cdata: the address of its c10::TensorImpl.
    void* p = cdata_of(tensor);
    if (p == nullptr) return false;
    const auto* t = static_cast<const c10::TensorImpl*>(p);
    // A plain dense CPU tensor: no Python subclass dispatch, no custom
    // sizes or strides (whose accessors are virtual and may refuse).
    if (t->device_type() != c10::DeviceType::CPU || t->layout() != c10::kStrided ||
        !t->is_cpu() || t->is_sparse() || t->is_nested() || !t->has_storage() ||
        t->is_python_dispatch() || t->key_set().has(c10::DispatchKey::Python) ||
        t->key_set().has(c10::DispatchKey::Functionalize)) {
      return false;
    }
    const c10::StorageImpl* s = t->storage().unsafeGetStorageImpl();
    if (s == nullptr || c10::impl::cow::is_cow_data_ptr(s->data_ptr())) return false;
    const c10::IntArrayRef sizes = t->sizes();
    const auto base = static_cast<char*>(const_cast<void*>(s->data_ptr().get()));
    out->scalar_type = static_cast<int>(t->dtype().toScalarType());
    out->contiguous = t->is_contiguous();
    out->negative = t->is_neg();
    out->ndim = static_cast<int>(sizes.size());
    out->sizes = sizes.data();
    out->storage = const_cast<c10::StorageImpl*>(s);
    out->storage_base = base;
    out->storage_nbytes = s->nbytes();
    out->data = base == nullptr ? nullptr
                                : base + t->storage_offset() * static_cast<std::int64_t>(
                                                                   t->dtype().itemsize());
    return true;
  } catch (...) {
    return false;
  }
}

void unpin(void* token) {
  auto* pin = static_cast<Pin*>(token);
  Hold* h = pin->hold;
  c10::StorageImpl* s = pin->storage.get();
  // The storage still holds the replacement and this is the last pin: put
  // the original back (the replacement's release drops its reference).
  if (hold_of(s->data_ptr()) == h && h->refs.load(std::memory_order_acquire) == 2) {
    c10::DataPtr replacement = s->set_data_ptr(std::move(h->original));
    (void)replacement;  // released here: refs 2 -> 1
  }
  delete pin;  // the storage reference
  unref(h);
}

// For tests: whether `storage` holds gyre's replacement DataPtr (pinned by
// an operation in flight) right now.
PyObject* is_pinned(PyObject*, PyObject* storage) {
  c10::StorageImpl* s = storage_impl(storage);
  if (s == nullptr) {
    PyErr_SetString(PyExc_TypeError, "expected a torch.UntypedStorage");
    return nullptr;
  }
  return PyBool_FromLong(hold_of(s->data_ptr()) != nullptr);
}

// read_tensor(tensor) for tests: (scalar type, contiguous, negative,
// sizes, data address, storage address, storage bytes), or None.
PyObject* read_tensor_py(PyObject*, PyObject* tensor) {
  TorchTensorFacts f;
  if (!read_tensor(tensor, &f)) Py_RETURN_NONE;
  PyObject* sizes = PyTuple_New(f.ndim);
  if (sizes == nullptr) return nullptr;
  for (int i = 0; i < f.ndim; ++i) PyTuple_SET_ITEM(sizes, i, PyLong_FromLongLong(f.sizes[i]));
  return Py_BuildValue("(iOONKKn)", f.scalar_type, f.contiguous ? Py_True : Py_False,
                       f.negative ? Py_True : Py_False, sizes,
                       static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(f.data)),
                       static_cast<unsigned long long>(
                           reinterpret_cast<std::uintptr_t>(f.storage_base)),
                       static_cast<Py_ssize_t>(f.storage_nbytes));
}

PyMethodDef methods[] = {
    {"read_tensor", &read_tensor_py, METH_O,
     "read_tensor(tensor): what gyre reads of a plain CPU tensor in C++ (scalar type, "
     "contiguous, negative, sizes, data address, storage address, storage bytes), or None"},
    {"is_pinned", &is_pinned, METH_O,
     "is_pinned(storage): whether an operation in flight pins this torch.UntypedStorage now"},
    {nullptr, nullptr, 0, nullptr}};

TorchMemoryApi api{kTorchMemoryApiVersion, GYRE_TORCH_VERSION, &pin, &unpin, &read_tensor,
                   &pin_storage, &pin_storage_lent};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_torch_memory",
                          "Pins CPU torch storages' memory while gyre's operations use it.",
                          -1, methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace
}  // namespace gyre::python

PyMODINIT_FUNC PyInit__torch_memory() {
  PyObject* m = PyModule_Create(&gyre::python::module_def);
  if (m == nullptr) return nullptr;
  PyObject* cap = PyCapsule_New(&gyre::python::api, gyre::python::kTorchMemoryCapsule, nullptr);
  if (cap == nullptr) {
    Py_DECREF(m);
    return nullptr;
  }
  if (PyModule_AddObject(m, "api", cap) != 0) {  // steals the reference only on success
    Py_DECREF(cap);
    Py_DECREF(m);
    return nullptr;
  }
  if (PyModule_AddStringConstant(m, "torch_version", GYRE_TORCH_VERSION) != 0) {
    Py_DECREF(m);  // the capsule is the module's now
    return nullptr;
  }
  return m;
}
