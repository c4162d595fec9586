// Python objects to gyre::TensorView: DLPack and the buffer protocol, and
// what could not be converted as a refusal for the runtime (tensor_import.h).
#include "tensor_import.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "host_pool.h"
#include "torch_objects.h"

namespace gyre::python {
namespace {

// kDLBool (torch.bool, numpy.bool_: 8 bits), newer than the DLPack 0.6
// header this builds against.
constexpr int kDLBoolCode = 6;

// Readable name of a DLPack dtype gyre does not take, for the error message.
std::string dl_dtype_name(const DLDataType& t) {
  std::string kind;
  switch (t.code) {
    case kDLInt: kind = "int"; break;
    case kDLUInt: kind = "uint"; break;
    case kDLFloat: kind = "float"; break;
    case kDLBfloat: kind = "bfloat"; break;
    case kDLComplex: kind = "complex"; break;
    case kDLBoolCode: return "bool" + std::to_string(t.bits);
    default: kind = "code" + std::to_string(t.code) + "_"; break;
  }
  return kind + std::to_string(t.bits);
}

std::optional<DataType> from_dl_dtype(const DLDataType& t) {
  if (t.code == kDLFloat && t.bits == 32) return DataType::kFloat32;
  if (t.code == kDLFloat && t.bits == 64) return DataType::kFloat64;
  if (t.code == kDLFloat && t.bits == 16) return DataType::kFloat16;
  if (t.code == kDLBfloat && t.bits == 16) return DataType::kBFloat16;
  if (t.code == kDLInt && t.bits == 8) return DataType::kInt8;
  if (t.code == kDLUInt && t.bits == 8) return DataType::kUInt8;
  if (t.code == kDLInt && t.bits == 32) return DataType::kInt32;
  if (t.code == kDLInt && t.bits == 64) return DataType::kInt64;
  if (t.code == kDLInt && t.bits == 16) return DataType::kInt16;
  if (t.code == kDLBoolCode && t.bits == 8) return DataType::kBool;
  return std::nullopt;
}

constexpr const char* kSupported =
    "supported: float32, float64, float16, bfloat16, int8, uint8, int16, int32, int64, bool";

// Compact row-major strides, in elements. Dimensions of extent 1 may carry
// any stride (producers differ there), and an empty tensor is contiguous.
bool is_row_major(const std::vector<std::int64_t>& shape, const std::int64_t* strides) {
  if (strides == nullptr) return true;
  std::int64_t numel = 1;
  for (auto d : shape) numel *= d;
  if (numel == 0) return true;
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// The dtype of a buffer-protocol format string with the given item size.
std::optional<DataType> from_buffer_format(const char* format, Py_ssize_t itemsize) {
  std::string f = format ? format : "B";
  // Native or little-endian standard sizes only ('<', '=', '@' on x86-64).
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.erase(0, 1);
  if (f.size() != 1) return std::nullopt;
  const char c = f[0];
  if (c == 'f' && itemsize == 4) return DataType::kFloat32;
  if (c == 'd' && itemsize == 8) return DataType::kFloat64;
  if (c == 'e' && itemsize == 2) return DataType::kFloat16;
  if (std::strchr("bhilqn", c)) {
    if (itemsize == 1) return DataType::kInt8;
    if (itemsize == 2) return DataType::kInt16;
    if (itemsize == 4) return DataType::kInt32;
    if (itemsize == 8) return DataType::kInt64;
  }
  if (std::strchr("BHILQN", c) && itemsize == 1) return DataType::kUInt8;
  if (c == '?' && itemsize == 1) return DataType::kBool;
  return std::nullopt;
}

// Ends a conversion: convert() turns this into the view's refusal, a clause
// naming the tensor ("input is not contiguous ...").
[[noreturn]] void refuse(const std::string& name, const std::string& why) {
  throw InvalidArgument(name + " " + why);
}

constexpr const char* kNegativeView =
    "is a negative view (torch's negative bit is set: the memory holds the values without "
    "their sign); pass tensor.resolve_neg()";

}  // namespace

namespace {

// gyre's dtype of a c10::ScalarType value (torch_memory_api.h).
std::optional<DataType> from_torch_scalar_type(int st) {
  switch (st) {
    case kTorchFloat32: return DataType::kFloat32;
    case kTorchFloat64: return DataType::kFloat64;
    case kTorchFloat16: return DataType::kFloat16;
    case kTorchBFloat16: return DataType::kBFloat16;
    case kTorchInt8: return DataType::kInt8;
    case kTorchUInt8: return DataType::kUInt8;
    case kTorchInt16: return DataType::kInt16;
    case kTorchInt32: return DataType::kInt32;
    case kTorchInt64: return DataType::kInt64;
    case kTorchBool: return DataType::kBool;
    default: return std::nullopt;
  }
}

}  // namespace

bool ImportedTensor::import_torch(py::handle obj, const std::string& name) {
  const TorchObjects* t = TorchObjects::get();
  if (t == nullptr) return false;
  PyObject* o = obj.ptr();
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(o));
  // Exactly these types: a subclass may override what the accessors say.
  if (type != t->tensor_type && type != t->parameter_type) return false;
  // Where gyre._torch_memory serves this torch, its TensorImpl says it all.
  TorchTensorFacts f;
  if (t->memory != nullptr && t->memory->read_tensor(o, &f)) {
    const std::optional<DataType> dt = from_torch_scalar_type(f.scalar_type);
    if (!dt || !f.contiguous) return false;  // refused by the DLPack route, with its reason
    if (f.negative) refuse(name, kNegativeView);
    view_.shape.assign(f.sizes, f.sizes + f.ndim);
    view_.dtype = *dt;
    view_.data = f.data;
    view_.device = Device{DeviceType::kCPU, 0};
    storage_impl_ = f.storage;
    return true;
  }
  // Whatever does not qualify, or raises (a tensor without storage), takes
  // the DLPack route, which refuses it with its reason as before.
  py::object cpu = attr_or_null(o, t->is_cpu);
  if (!cpu || cpu.ptr() != Py_True) return false;
  py::object layout = attr_or_null(o, t->layout);
  if (!layout || layout.ptr() != t->strided) return false;
  py::object dtype = attr_or_null(o, t->dtype);
  if (!dtype) return false;
  std::optional<DataType> dt;
  for (const auto& e : t->dtypes) {
    if (e.dtype == dtype.ptr()) dt = e.dt;
  }
  if (!dt) return false;
  py::object contiguous = call_or_null(o, t->is_contiguous);
  if (!contiguous || contiguous.ptr() != Py_True) return false;
  if (torch_negative_view(*t, o)) refuse(name, kNegativeView);
  std::vector<std::int64_t> dims;
  if (!torch_shape(*t, o, dims)) return false;
  py::object ptr = call_or_null(o, t->data_ptr);
  if (!ptr) return false;
  void* data = PyLong_AsVoidPtr(ptr.ptr());
  if (data == nullptr && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  view_.shape = std::move(dims);
  view_.dtype = *dt;
  view_.data = data;
  view_.device = Device{DeviceType::kCPU, 0};
  return true;
}

std::unique_ptr<ImportedTensor> ImportedTensor::from_object(py::handle obj, const std::string& name,
                                                            Access access) {
  std::unique_ptr<ImportedTensor> t(new ImportedTensor());
  const py::handle caller = obj;
  if (t->import_torch(obj, name)) {
    t->stage(caller, name, access);
    return t;
  }
  py::object detached;
  bool torch_tensor = false;
  if (const TorchObjects* torch = TorchObjects::get(); is_torch_tensor(torch, obj.ptr())) {
    if (torch_negative_view(*torch, obj.ptr())) refuse(name, kNegativeView);
    // Exported as a detached alias: see the file comment of tensor_import.h.
    detached = obj.attr("detach")();
    obj = detached;
    torch_tensor = true;
  }
  if (py::hasattr(obj, "__dlpack__") && py::hasattr(obj, "__dlpack_device__")) {
    // The device first: a GPU tensor this build cannot take is refused
    // before it is exported; a CUDA tensor goes to the NCCL backend where
    // the build has one.
    py::tuple dev = obj.attr("__dlpack_device__")();
    const int dev_type = dev[0].cast<int>();
    const bool cuda_backend = gyre::nccl_built();
    // The runtime checks the device index and the memory (operations.cc).
    if (dev_type == kDLCUDA && cuda_backend) {
      t->import_dlpack(obj, name, true);
      return t;
    }
    if (dev_type == kDLCUDA || dev_type == kDLCUDAManaged || dev_type == kDLROCM) {
      if (cuda_backend) {
        refuse(name, "is on a GPU (DLPack device type " + std::to_string(dev_type) +
                         ") that is not CUDA; gyre takes CPU and CUDA tensors");
      }
      refuse(name, "is on a GPU (DLPack device type " + std::to_string(dev_type) +
                       "), but this build of gyre has no NCCL support; move it to the CPU");
    }
    if (dev_type != kDLCPU && dev_type != kDLCUDAHost) {
      refuse(name, "is on DLPack device type " + std::to_string(dev_type) +
                       "; gyre takes CPU tensors only");
    }
    try {
      t->import_dlpack(obj, name, false);
      if (torch_tensor) t->stage(caller, name, access);
      return t;
    } catch (py::error_already_set& e) {
      // numpy refuses to export read-only arrays through DLPack 0.6: those
      // (and other producers that refuse) still work through the buffer
      // protocol when they support it.
      if (t->import_buffer(obj, name, access)) return t;
      refuse(name, std::string("could not be exported through DLPack: ") + e.what());
    }
  }
  if (t->import_buffer(obj, name, access)) return t;
  refuse(name, "is not a tensor: expected a tensor (an object with __dlpack__ or the buffer "
               "protocol), got " +
                   std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
}

void ImportedTensor::stage(py::handle tensor, const std::string& name, Access access) {
  const std::size_t nbytes = view_.nbytes();
  if (nbytes == 0) return;  // nothing is read or written
  tensor_ = py::reinterpret_borrow<py::object>(tensor);
  if (access == Access::kWriteNew) return;  // nobody else holds it: kept alive, nothing more
  name_ = name;
  caller_data_ = view_.data;
  write_back_pending_ = access == Access::kWrite;
  // In place where gyre._torch_memory can pin the storage's memory.
  if (const TorchObjects* t = TorchObjects::get(); t != nullptr && t->memory != nullptr) {
    if (storage_impl_ != nullptr) {
      pin_ = t->memory->pin_storage(storage_impl_);
      // A tensor of gyre.torch.empty_shared: its memory is gyre's pool's,
      // lent to torch; copied, it would lose what the pool is for.
      if (pin_ == nullptr && is_shared(view_.data, nbytes)) {
        pin_ = t->memory->pin_storage_lent(storage_impl_);
      }
    } else if (py::object storage = call_or_null(tensor.ptr(), t->untyped_storage)) {
      pin_ = t->memory->pin(storage.ptr());
    }
    if (pin_ != nullptr) {
      unpin_ = t->memory->unpin;
      return;
    }
  }
  // Built only on failure: staging runs on every call with a torch tensor.
  auto out_of_memory = [&] {
    refuse(name, "could not be staged: out of memory for a copy of " + std::to_string(nbytes) +
                     " bytes");
  };
  if (nbytes >= kPooledMinBytes) {
    try {
      staging_ = acquire_host_block(nbytes);  // 2 MiB aligned
    } catch (const std::bad_alloc&) {
      out_of_memory();
    }
  } else {
    constexpr std::size_t kAlign = 64;
    void* p = std::aligned_alloc(kAlign, (nbytes + kAlign - 1) / kAlign * kAlign);
    if (p == nullptr) out_of_memory();
    staging_.reset(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
  }
  std::memcpy(staging_.get(), view_.data, nbytes);
  view_.data = staging_.get();
}

void ImportedTensor::share_staging_with(ImportedTensor& earlier) {
  if (!staging_ || !earlier.staging_) return;  // not staged: the runtime sees the memory
  const auto a = reinterpret_cast<std::uintptr_t>(caller_data_);
  const auto b = reinterpret_cast<std::uintptr_t>(earlier.caller_data_);
  const std::size_t na = view_.nbytes(), nb = earlier.view_.nbytes();
  if (a == b) {
    staging_.reset();
    view_.data = earlier.view_.data;
    earlier.write_back_pending_ = earlier.write_back_pending_ || write_back_pending_;
    write_back_pending_ = false;
  } else if (a < b + nb && b < a + na) {
    staging_.reset();
    write_back_pending_ = false;
    view_.refusal = name_ + " overlaps another tensor of the call without being the same "
                            "buffer: input and output overlap (in-place needs the output to be "
                            "the input)";
  }
}

std::string ImportedTensor::write_back() {
  if (!write_back_pending_) return "";
  write_back_pending_ = false;
  const std::size_t nbytes = view_.nbytes();
  const std::string changed =
      name_ + " was resized or given other memory while its operation was in flight";
  const std::string advice =
      "; its result was not written into it. Do not change a tensor before its operation "
      "has completed (synchronize(), wait())";
  try {
    // The tensor must view the same bytes as at the call, and they must lie
    // inside its storage's memory as it is now (torch may have reallocated
    // it): only then is writing them safe and what the caller expects.
    const TorchObjects* t = TorchObjects::get();
    PyObject* o = tensor_.ptr();
    // What the tensor is now: read in C++ where gyre._torch_memory serves
    // this torch, else through torch's Python accessors.
    std::byte* now = nullptr;
    const std::byte* base = nullptr;
    std::size_t capacity = 0;
    bool contiguous = false;
    std::span<const std::int64_t> dims;
    std::vector<std::int64_t> python_dims;
    if (TorchTensorFacts f; t->memory != nullptr && t->memory->read_tensor(o, &f)) {
      now = static_cast<std::byte*>(f.data);
      base = static_cast<const std::byte*>(f.storage_base);
      capacity = f.storage_nbytes;
      contiguous = f.contiguous;
      dims = std::span<const std::int64_t>(f.sizes, static_cast<std::size_t>(f.ndim));
    } else {
      py::object ptr = call_or_null(o, t->data_ptr);
      py::object contiguous_obj = call_or_null(o, t->is_contiguous);
      py::object storage = call_or_null(o, t->untyped_storage);
      if (!ptr || !contiguous_obj || !storage || !torch_shape(*t, o, python_dims)) {
        return changed + advice;
      }
      now = static_cast<std::byte*>(PyLong_AsVoidPtr(ptr.ptr()));
      if (now == nullptr && PyErr_Occurred()) throw py::error_already_set();
      base = reinterpret_cast<const std::byte*>(storage.attr("data_ptr")().cast<std::uintptr_t>());
      capacity = storage.attr("nbytes")().cast<std::size_t>();
      contiguous = contiguous_obj.ptr() == Py_True;
      dims = python_dims;
    }
    if (!std::equal(view_.shape.begin(), view_.shape.end(), dims.begin(), dims.end())) {
      return changed + " (shape " + shape_string(view_.shape) + " -> " +
             shape_string(std::vector<std::int64_t>(dims.begin(), dims.end())) + ")" + advice;
    }
    if (now != caller_data_ || !contiguous || base == nullptr || now < base ||
        now + nbytes > base + capacity) {
      return changed + advice;
    }
    // Pinned: the result is in the tensor's memory already.
    if (staging_) std::memcpy(now, staging_.get(), nbytes);
    return "";
  } catch (py::error_already_set& e) {
    return name_ + ": its result could not be written into it: " + e.what();
  } catch (const py::cast_error& e) {
    return name_ + ": its result could not be written into it: " + e.what();
  }
}

std::unique_ptr<ImportedTensor> ImportedTensor::convert(py::handle obj, const std::string& name,
                                                        Access access) {
  try {
    return from_object(obj, name, access);
  } catch (const InvalidArgument& e) {
    return refused(e.what());
  } catch (py::error_already_set& e) {
    // The producer raised (e.g. in __dlpack_device__): it could not be
    // converted. KeyboardInterrupt and SystemExit are not conversion failures.
    if (!e.matches(PyExc_Exception)) throw;
    return refused(name + " could not be converted: " + e.what());
  } catch (const py::cast_error& e) {
    return refused(name + " could not be converted: " + e.what());
  }
}

std::unique_ptr<ImportedTensor> ImportedTensor::refused(std::string refusal) {
  std::unique_ptr<ImportedTensor> t(new ImportedTensor());
  t->view_.refusal = std::move(refusal);
  return t;
}

void ImportedTensor::import_dlpack(py::handle obj, const std::string& name, bool cuda) {
  // CPU tensors: no stream argument (torch reads None as "no synchronisation").
  // CUDA tensors: stream 1, the legacy default stream, which the producer
  // makes wait for its current stream; gyre's stream is ordered after it
  // (core/src/backends/nccl/nccl_backend.h).
  py::object capsule = cuda ? obj.attr("__dlpack__")(py::arg("stream") = 1)
                            : obj.attr("__dlpack__")();
  PyObject* cap = capsule.ptr();
  if (!PyCapsule_IsValid(cap, "dltensor")) {
    refuse(name, "is not exportable: __dlpack__() did not return an unused 'dltensor' capsule");
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  // From here the capsule no longer frees the tensor: we do, in ~ImportedTensor.
  if (PyCapsule_SetName(cap, "used_dltensor") != 0) throw py::error_already_set();
  managed_ = managed;

  const DLTensor& dl = managed->dl_tensor;
  view_.shape.assign(dl.shape, dl.shape + dl.ndim);
  if (dl.dtype.lanes != 1) {
    refuse(name, "has vector lanes (" + std::to_string(dl.dtype.lanes) + "); gyre takes lanes == 1");
  }
  auto dt = from_dl_dtype(dl.dtype);
  if (!dt) refuse(name, "has unsupported dtype " + dl_dtype_name(dl.dtype) + " (" + kSupported + ")");
  view_.dtype = *dt;
  if (!is_row_major(view_.shape, dl.strides)) {
    refuse(name, "is not contiguous (shape " + shape_string(view_.shape) +
                     "); pass a contiguous tensor, e.g. tensor.contiguous()");
  }
  view_.data = static_cast<char*>(dl.data) + dl.byte_offset;
  view_.device = dl.device.device_type == kDLCUDA ? Device{DeviceType::kCUDA, dl.device.device_id}
                                                  : Device{DeviceType::kCPU, 0};
}

bool ImportedTensor::import_buffer(py::handle obj, const std::string& name, Access access) {
  if (!PyObject_CheckBuffer(obj.ptr())) return false;
  int flags = PyBUF_STRIDES | PyBUF_FORMAT;
  if (PyObject_GetBuffer(obj.ptr(), &buffer_, flags) != 0) {
    PyErr_Clear();
    return false;
  }
  has_buffer_ = true;
  if (access != Access::kRead && buffer_.readonly) {
    refuse(name, "is read-only, but this operation writes its result into it");
  }
  auto dt = from_buffer_format(buffer_.format, buffer_.itemsize);
  if (!dt) {
    refuse(name, std::string("has unsupported buffer format '") +
                     (buffer_.format ? buffer_.format : "B") + "' (" + kSupported + ")");
  }
  view_.dtype = *dt;
  view_.shape.assign(buffer_.shape, buffer_.shape + buffer_.ndim);
  if (!PyBuffer_IsContiguous(&buffer_, 'C')) {
    refuse(name, "is not contiguous (shape " + shape_string(view_.shape) +
                     "); pass a C-contiguous array, e.g. numpy.ascontiguousarray(a)");
  }
  view_.data = buffer_.buf;
  view_.device = Device{DeviceType::kCPU, 0};
  return true;
}

ImportedTensor::~ImportedTensor() {
  // A result nobody synchronized (the handle was dropped) still reaches the
  // tensor, as it would without staging; a refusal has nobody to tell.
  if (write_back_pending_ && succeeded_) write_back();
  if (pin_ != nullptr) unpin_(pin_);
  tensor_ = py::object();
  if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  if (has_buffer_) PyBuffer_Release(&buffer_);
}

}  // namespace gyre::python
