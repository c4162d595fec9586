// torch's objects that the torch route of tensor_import.cc compares with,
// looked up once the caller has imported torch (gyre never imports it), and
// small accessors of torch tensors that leave no Python error behind. GIL
// held for everything here.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gyre/gyre.h"
#include "torch_memory_api.h"

namespace gyre::python {

namespace py = pybind11;

// What the torch route compares with: torch's types, its strided layout and
// its dtypes, taken from the torch module once the caller has imported it,
// and the attribute names, interned. Held for the life of the process (the
// interpreter keeps torch's types and dtypes alive as long). GIL held.
struct TorchObjects {
  PyObject* tensor_type = nullptr;     // torch.Tensor
  PyObject* parameter_type = nullptr;  // torch.nn.Parameter
  PyObject* strided = nullptr;         // torch.strided
  struct DtypeEntry {
    PyObject* dtype;
    DataType dt;
  };
  std::vector<DtypeEntry> dtypes;
  PyObject *is_cpu, *layout, *dtype, *shape, *is_contiguous, *is_neg, *data_ptr,
      *untyped_storage;
  // gyre._torch_memory, where it was built for this torch and the copies are
  // not asked for (GYRE_TORCH_IN_FLIGHT=copy); nullptr otherwise.
  const TorchMemoryApi* memory = nullptr;

  // nullptr until torch is imported (by someone else).
  static const TorchObjects* get() {
    static TorchObjects* objects = nullptr;
    if (objects == nullptr) objects = load();
    return objects;
  }

 private:
  static const TorchMemoryApi* load_memory(py::handle torch);
  static TorchObjects* load();
};

// New reference, or nullptr with the Python error cleared.
py::object attr_or_null(PyObject* obj, PyObject* name);
py::object call_or_null(PyObject* obj, PyObject* name);
// A torch tensor (any subclass) with the negative bit set.
bool torch_negative_view(const TorchObjects& t, PyObject* obj);
// An instance of torch.Tensor (any subclass); false while torch is not imported.
bool is_torch_tensor(const TorchObjects* t, PyObject* obj);
// A torch tensor's shape (torch.Size, a tuple); false with the Python error
// cleared if it cannot be read.
bool torch_shape(const TorchObjects& t, PyObject* obj, std::vector<std::int64_t>& dims);

// How CPU torch tensors in flight are kept safe in this process: "pin" (the
// storage's memory pinned by gyre._torch_memory, no copy), "copy" (staged
// copies), or "" while torch is not imported (tensor_import.h).
std::string torch_in_flight_mode();

}  // namespace gyre::python
