// Start-up without an MPI launcher, for the gyre.bootstrap package module:
// the process's PMI-1 server (gyre/bootstrap.h). Type conversion and
// process lifetime only.
#pragma once

#include <pybind11/pybind11.h>

namespace gyre::python {

void bind_bootstrap(pybind11::module_& m);

}  // namespace gyre::python
