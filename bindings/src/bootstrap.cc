#include "bootstrap.h"

#include <pybind11/stl.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "gyre/bootstrap.h"
#include "gyre/error.h"

namespace py = pybind11;

namespace gyre::python {

namespace {

std::mutex g_server_mu;  // guards g_server
// The process's PMI server: it must outlive MPI_Finalize, which gyre runs
// from a C atexit hook (after the interpreter has gone), so it is not a
// Python object. Its own atexit hook, registered when it starts (before
// init(), so it runs after gyre's), waits for the peers to finalize.
PmiServer* g_server = nullptr;

void stop_server_at_exit() {
  std::lock_guard<std::mutex> lock(g_server_mu);
  delete g_server;
  g_server = nullptr;
}

}  // namespace

void bind_bootstrap(py::module_& m) {
  m.def(
      "start_pmi_server",
      [](int size, const std::string& bind_address, int port, double startup_timeout_s) {
        std::lock_guard<std::mutex> lock(g_server_mu);
        if (g_server) {
          throw StateError("start_pmi_server(): this process already runs a PMI server (a "
                           "process starts MPI once)");
        }
        g_server = new PmiServer(
            size, bind_address, port,
            std::chrono::milliseconds(static_cast<std::int64_t>(startup_timeout_s * 1000)));
        std::atexit(stop_server_at_exit);
        return g_server->port();
      },
      py::arg("size"), py::arg("bind_address") = "0.0.0.0", py::arg("port") = 0,
      py::arg("startup_timeout_s") = 300.0,
      "Starts this process's PMI-1 server for `size` processes (gyre/bootstrap.h); returns its "
      "port. Before init(); once per process.");
  m.def("pmi_server_error", [] {
    std::lock_guard<std::mutex> lock(g_server_mu);
    return g_server ? g_server->error() : std::string();
  });
}

}  // namespace gyre::python
