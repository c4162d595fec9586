// gyre.SharedBuffer and _gyre.alloc_shared: bytes from this rank's part of
// the host's pool (gyre::alloc_shared), for gyre.torch.empty_shared.
#include "shared_buffer.h"

#include <cstddef>

#include "gyre/gyre.h"

namespace gyre::python {

namespace {

// A buffer of gyre::alloc_shared, given back when the object goes (the
// tensor made over it with torch.frombuffer holds it).
class SharedBuffer {
 public:
  SharedBuffer(void* p, std::size_t bytes) : p_(p), bytes_(bytes) {}
  ~SharedBuffer() {
    try {
      free_shared(p_);
    } catch (...) {  // freed once, by this object alone: nothing can fail here
    }
  }
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  py::buffer_info buffer() const {
    return py::buffer_info(p_, 1, "B", 1, {static_cast<py::ssize_t>(bytes_)}, {py::ssize_t{1}},
                           /*readonly=*/false);
  }

 private:
  void* p_;
  std::size_t bytes_;
};

}  // namespace

void bind_shared_buffers(py::module_& m) {
  py::class_<SharedBuffer>(m, "SharedBuffer", py::buffer_protocol(),
                           "Bytes from this rank's part of the host's pool (gyre::alloc_shared).")
      .def_buffer([](const SharedBuffer& b) { return b.buffer(); });
  m.def(
      "alloc_shared",
      [](std::size_t bytes) -> py::object {
        void* p = alloc_shared(bytes);
        if (p == nullptr) return py::none();
        return py::cast(new SharedBuffer(p, bytes), py::return_value_policy::take_ownership);
      },
      py::arg("nbytes"),
      "A SharedBuffer of nbytes from the host's pool, or None when the pool has no room "
      "(or there is no pool: GYRE_SHM_POOL_BYTES).");
}

}  // namespace gyre::python
