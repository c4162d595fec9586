// The Python binding of gyre::alloc_shared (shared_buffer.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace gyre::python {

namespace py = pybind11;

void bind_shared_buffers(py::module_& m);

}  // namespace gyre::python
