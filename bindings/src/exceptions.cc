#include "exceptions.h"

#include <array>

#include "gyre/error.h"

namespace gyre::python {
namespace {

// The Python classes, set once by gyre/__init__.py. Deliberately leaked:
// they must outlive any translation during interpreter shutdown.
enum Kind { kGyre, kInvalid, kMismatch, kDivergence, kTimeout, kTransport, kState, kRankFailed, kKinds };
std::array<PyObject*, kKinds> classes{};

void raise(Kind kind, const char* what) {
  PyObject* cls = classes[kind] != nullptr ? classes[kind] : PyExc_RuntimeError;
  PyErr_SetString(cls, what);
}

}  // namespace

void set_exception_classes(const py::dict& by_name) {
  const std::array<const char*, kKinds> names = {
      "GyreError",    "InvalidArgumentError", "MismatchError", "DivergenceError",
      "TimeoutError", "TransportError",       "StateError",    "RankFailedError"};
  for (int k = 0; k < kKinds; ++k) {
    py::object cls = by_name[names[k]];
    Py_XDECREF(classes[k]);
    classes[k] = cls.release().ptr();
  }
}

void register_translator() {
  py::register_exception_translator([](std::exception_ptr p) {
    // Most derived first.
    try {
      std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      raise(kInvalid, e.what());
    } catch (const MismatchError& e) {
      raise(kMismatch, e.what());
    } catch (const DivergenceError& e) {
      raise(kDivergence, e.what());
    } catch (const TimeoutError& e) {
      raise(kTimeout, e.what());
    } catch (const RankFailedError& e) {
      raise(kRankFailed, e.what());
    } catch (const TransportError& e) {
      raise(kTransport, e.what());
    } catch (const StateError& e) {
      raise(kState, e.what());
    } catch (const Error& e) {
      raise(kGyre, e.what());
    }
  });
}

}  // namespace gyre::python
