#include "torch_objects.h"

#include <cstdlib>
#include <utility>

namespace gyre::python {

const TorchMemoryApi* TorchObjects::load_memory(py::handle torch) {
  const char* mode = std::getenv("GYRE_TORCH_IN_FLIGHT");
  if (mode != nullptr && std::string(mode) == "copy") return nullptr;
  try {
    py::object m = py::module_::import("gyre._torch_memory");
    auto* api = static_cast<const TorchMemoryApi*>(
        PyCapsule_GetPointer(m.attr("api").ptr(), kTorchMemoryCapsule));
    if (api == nullptr) throw py::error_already_set();
    const auto version = torch.attr("__version__").cast<std::string>();
    if (api->version != kTorchMemoryApiVersion || version != api->torch_version) return nullptr;
    return api;
  } catch (py::error_already_set&) {
    PyErr_Clear();  // not built (no torch at build time): copies
    return nullptr;
  }
}

TorchObjects* TorchObjects::load() {
  PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
  if (torch == nullptr) return nullptr;
  try {
    py::handle t(torch);
    auto keep = [](py::object x) { return x.release().ptr(); };
    auto* o = new TorchObjects();
    o->tensor_type = keep(t.attr("Tensor"));
    o->parameter_type = keep(t.attr("nn").attr("Parameter"));
    o->strided = keep(t.attr("strided"));
    const std::pair<const char*, DataType> names[] = {
        {"float32", DataType::kFloat32}, {"float64", DataType::kFloat64},
        {"float16", DataType::kFloat16}, {"bfloat16", DataType::kBFloat16},
        {"int8", DataType::kInt8},       {"uint8", DataType::kUInt8},
        {"int16", DataType::kInt16},     {"int32", DataType::kInt32},
        {"int64", DataType::kInt64},     {"bool", DataType::kBool}};
    for (const auto& [name, dt] : names) o->dtypes.push_back({keep(t.attr(name)), dt});
    o->is_cpu = PyUnicode_InternFromString("is_cpu");
    o->layout = PyUnicode_InternFromString("layout");
    o->dtype = PyUnicode_InternFromString("dtype");
    o->shape = PyUnicode_InternFromString("shape");
    o->is_contiguous = PyUnicode_InternFromString("is_contiguous");
    o->is_neg = PyUnicode_InternFromString("is_neg");
    o->data_ptr = PyUnicode_InternFromString("data_ptr");
    o->untyped_storage = PyUnicode_InternFromString("untyped_storage");
    o->memory = load_memory(t);
    return o;
  } catch (py::error_already_set&) {
    // A torch without these names (being imported, or too old): the
    // DLPack route serves it.
    PyErr_Clear();
    return nullptr;
  }
}

py::object attr_or_null(PyObject* obj, PyObject* name) {
  PyObject* r = PyObject_GetAttr(obj, name);
  if (r == nullptr) PyErr_Clear();
  return py::reinterpret_steal<py::object>(r);
}
py::object call_or_null(PyObject* obj, PyObject* name) {
  PyObject* r = PyObject_CallMethodNoArgs(obj, name);
  if (r == nullptr) PyErr_Clear();
  return py::reinterpret_steal<py::object>(r);
}

bool torch_negative_view(const TorchObjects& t, PyObject* obj) {
  py::object neg = call_or_null(obj, t.is_neg);
  return neg && neg.ptr() == Py_True;
}

bool is_torch_tensor(const TorchObjects* t, PyObject* obj) {
  if (t == nullptr) return false;
  const int r = PyObject_IsInstance(obj, t->tensor_type);
  if (r < 0) PyErr_Clear();
  return r == 1;
}

bool torch_shape(const TorchObjects& t, PyObject* obj, std::vector<std::int64_t>& dims) {
  py::object shape = attr_or_null(obj, t.shape);
  if (!shape || !PyTuple_Check(shape.ptr())) return false;
  dims.assign(static_cast<std::size_t>(PyTuple_GET_SIZE(shape.ptr())), 0);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), static_cast<Py_ssize_t>(i)));
    if (dims[i] == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  }
  return true;
}

std::string torch_in_flight_mode() {
  const TorchObjects* t = TorchObjects::get();
  if (t == nullptr) return "";
  return t->memory != nullptr ? "pin" : "copy";
}

}  // namespace gyre::python
