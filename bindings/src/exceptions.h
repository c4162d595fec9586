// gyre::Error and its subclasses become the Python exceptions of the same
// names defined in gyre/exceptions.py (GyreError, InvalidArgumentError,
// MismatchError, DivergenceError, TimeoutError, TransportError, StateError),
// keeping the runtime's message. Called at import, GIL held.
#pragma once

#include <pybind11/pybind11.h>

namespace gyre::python {

namespace py = pybind11;

// Takes {name: class} from the Python package.
void set_exception_classes(const py::dict& by_name);
void register_translator();

}  // namespace gyre::python
