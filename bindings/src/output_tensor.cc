#include "output_tensor.h"

#include <dlpack/dlpack.h>

#include <vector>

#include "host_pool.h"

namespace gyre::python {
namespace {

DLDataType to_dl_dtype(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return {kDLFloat, 32, 1};
    case DataType::kFloat64: return {kDLFloat, 64, 1};
    case DataType::kFloat16: return {kDLFloat, 16, 1};
    case DataType::kBFloat16: return {kDLBfloat, 16, 1};
    case DataType::kInt8: return {kDLInt, 8, 1};
    case DataType::kUInt8: return {kDLUInt, 8, 1};
    case DataType::kInt32: return {kDLInt, 32, 1};
    case DataType::kInt64: return {kDLInt, 64, 1};
    case DataType::kInt16: return {kDLInt, 16, 1};
    case DataType::kBool: return {6, 8, 1};  // kDLBool (newer than the DLPack 0.6 header)
  }
  throw InvalidArgument("output has an unknown dtype");
}

// Format characters of the buffer protocol; bfloat16 has none (numpy has no
// such dtype), so it is exported through DLPack only.
const char* buffer_format(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return "f";
    case DataType::kFloat64: return "d";
    case DataType::kFloat16: return "e";
    case DataType::kInt8: return "b";
    case DataType::kUInt8: return "B";
    case DataType::kInt32: return "i";
    case DataType::kInt64: return "q";
    case DataType::kInt16: return "h";
    case DataType::kBool: return "?";
    case DataType::kBFloat16: break;
  }
  throw InvalidArgument("a bfloat16 output cannot be viewed through the buffer protocol; use DLPack");
}

// Owns what the DLManagedTensor points to: the handle (hence the bytes) and
// the shape array.
struct ExportContext {
  Handle handle;
  std::shared_ptr<std::byte> block;
  std::vector<std::int64_t> shape;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* self) { delete static_cast<ExportContext*>(self->manager_ctx); }

// Frees the tensor only if no consumer took it (the name is still "dltensor").
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  } else {
    PyErr_Clear();
  }
}

// A valid, aligned address for empty outputs, whose vector may hold none.
alignas(256) std::byte empty_storage[1];

}  // namespace

void* OutputTensor::data() const {
  if (block_) return block_.get();
  const OwnedTensor& t = handle_.output();
  return t.data.empty() ? static_cast<void*>(empty_storage)
                        : const_cast<std::byte*>(t.data.data());
}

py::capsule OutputTensor::to_dlpack() const {
  auto ctx = std::make_unique<ExportContext>();
  ctx->handle = handle_;
  ctx->block = block_;
  ctx->shape = shape();
  DLManagedTensor& m = ctx->managed;
  m.dl_tensor.data = data();
  m.dl_tensor.device = DLDevice{kDLCPU, 0};
  m.dl_tensor.ndim = static_cast<int>(ctx->shape.size());
  m.dl_tensor.dtype = to_dl_dtype(dtype());
  m.dl_tensor.shape = ctx->shape.data();
  m.dl_tensor.strides = nullptr;  // compact row-major
  m.dl_tensor.byte_offset = 0;
  m.manager_ctx = ctx.get();
  m.deleter = &delete_export;
  PyObject* cap = PyCapsule_New(&m, "dltensor", &capsule_destructor);
  if (cap == nullptr) throw py::error_already_set();
  ctx.release();  // owned by the capsule, then by the consumer
  return py::reinterpret_steal<py::capsule>(cap);
}

py::buffer_info OutputTensor::buffer() const {
  const auto item = static_cast<py::ssize_t>(dtype_size(dtype()));
  std::vector<py::ssize_t> shape(this->shape().begin(), this->shape().end());
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = item;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return py::buffer_info(data(), item, buffer_format(dtype()),
                         static_cast<py::ssize_t>(shape.size()), shape, strides,
                         /*readonly=*/false);
}

void bind_output_tensor(py::module_& m) {
  m.def("_host_blocks_mapped", &host_blocks_mapped,
        "Blocks the extension's host pool has mapped so far (host_pool.h); for tests.");
  py::class_<OutputTensor>(m, "OutputTensor", py::buffer_protocol(),
                           "Result of allgather/alltoall/reducescatter, owned by gyre.")
      .def_buffer([](const OutputTensor& o) { return o.buffer(); })
      .def(
          "__dlpack__",
          [](const OutputTensor& o, py::object /*stream*/, py::object /*max_version*/,
             py::object /*dl_device*/, py::object /*copy*/) { return o.to_dlpack(); },
          py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
          py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const OutputTensor&) { return py::make_tuple(int(kDLCPU), 0); })
      .def_property_readonly(
          "dtype", [](const OutputTensor& o) { return std::string(dtype_name(o.dtype())); })
      .def_property_readonly("shape", [](const OutputTensor& o) {
        py::tuple s(o.shape().size());
        for (std::size_t i = 0; i < o.shape().size(); ++i) s[i] = o.shape()[i];
        return s;
      });
}

}  // namespace gyre::python
