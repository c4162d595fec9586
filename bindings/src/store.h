// The parameter store's Python binding (gyre._gyre.ParameterStore), used by
// the gyre.ps package module. Type conversion only: the store is
// gyre/store.h.
#pragma once

#include <pybind11/pybind11.h>

namespace gyre::python {

void bind_store(pybind11::module_& m);

}  // namespace gyre::python
