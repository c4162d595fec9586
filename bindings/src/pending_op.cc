// Python handles of enqueued operations: keeping tensors alive until
// completion, waiting, and running Python callbacks on completion.
#include "pending_op.h"

#include <atomic>
#include <chrono>
#include <deque>
#include <thread>

namespace gyre::python {
namespace {

// Tensors of completed operations waiting for a thread with the GIL.
std::mutex& graveyard_mutex() {
  static std::mutex mu;  // guards graveyard()
  return mu;
}
Imports& graveyard() {
  // Never destroyed: it may be touched by the background thread while the
  // interpreter exits.
  static auto* g = new Imports();
  return *g;
}
std::atomic<bool> drain_scheduled{false};

int drain_pending_call(void*) {
  drain_scheduled.store(false);
  drain_graveyard();
  return 0;
}

void bury(Imports&& imports) {
  if (imports.empty()) return;
  {
    std::lock_guard<std::mutex> lock(graveyard_mutex());
    for (auto& t : imports) graveyard().push_back(std::move(t));
  }
  imports.clear();
  // Py_AddPendingCall needs neither the GIL nor a thread state. If the queue
  // of pending calls is full, the next binding call drains instead.
  if (!drain_scheduled.exchange(true)) {
    if (Py_AddPendingCall(&drain_pending_call, nullptr) != 0) drain_scheduled.store(false);
  }
}

// Runs the Python callables of completed operations (add_done_callback) on
// a thread of its own, which takes the GIL; the background thread only
// queues them. Created on first use and never destroyed: its thread may
// still be parked on the queue while the interpreter exits.
class CallbackThread {
 public:
  static CallbackThread& instance() {
    static auto* t = new CallbackThread();
    return *t;
  }

  // Takes over one reference to `fn`. Any thread; no GIL needed.
  void post(PyObject* fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(fn);
    }
    cv_.notify_one();
  }

 private:
  CallbackThread() { std::thread([this] { run(); }).detach(); }

  static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
  }

  void run() {
    for (;;) {
      std::deque<PyObject*> batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        batch.swap(queue_);
      }
      // Past this point taking the GIL would park the thread for good; the
      // references are dropped with the interpreter.
      if (finalizing()) return;
      py::gil_scoped_acquire gil;
      for (PyObject* fn : batch) {
        PyObject* result = PyObject_CallNoArgs(fn);
        if (result == nullptr) {
          PyErr_WriteUnraisable(fn);
        } else {
          Py_DECREF(result);
        }
        Py_DECREF(fn);
      }
      drain_graveyard();
    }
  }

  std::mutex mu_;  // guards queue_
  std::condition_variable cv_;
  std::deque<PyObject*> queue_;
};

}  // namespace

void drain_graveyard() {
  Imports dead;
  {
    std::lock_guard<std::mutex> lock(graveyard_mutex());
    dead.swap(graveyard());
  }
  dead.clear();  // deleters run here, with the GIL held
}

Completion::~Completion() { bury(std::move(keep)); }

std::shared_ptr<PendingOp> PendingOp::start(Imports keep, const std::function<Handle()>& enqueue) {
  auto op = std::make_shared<PendingOp>();
  op->completion_ = std::make_shared<Completion>();
  op->completion_->keep = std::move(keep);
  {
    // The runtime may block briefly on its queue; completion callbacks of
    // other operations never wait for the GIL, so releasing it is safe.
    py::gil_scoped_release release;
    op->handle_ = enqueue();
    std::shared_ptr<Completion> c = op->completion_;
    op->handle_.on_complete([c](std::exception_ptr) {
      Imports done;
      {
        std::lock_guard<std::mutex> lock(c->mu);
        c->done = true;
        done.swap(c->keep);
      }
      c->cv.notify_all();
      bury(std::move(done));
    });
  }
  return op;
}

void PendingOp::add_done_callback(py::object fn) const {
  if (!PyCallable_Check(fn.ptr())) {
    throw py::type_error("add_done_callback takes a callable, got " +
                         std::string(py::str(py::type::of(fn).attr("__name__"))));
  }
  // The reference travels to the callback thread, which drops it with the
  // GIL held. The runtime completes every handle (shutdown fails pending
  // ones), so the callback runs exactly once.
  PyObject* raw = fn.release().ptr();
  handle_.on_complete([raw](std::exception_ptr) { CallbackThread::instance().post(raw); });
}

bool PendingOp::poll() const { return handle_.poll(); }

void PendingOp::wait() const {
  using namespace std::chrono_literals;
  for (;;) {
    bool done = false;
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(completion_->mu);
      done = completion_->cv.wait_for(lock, 50ms, [&] { return completion_->done; });
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  drain_graveyard();
  // Completed: wait() returns at once, or rethrows the operation's error.
  handle_.wait();
}

}  // namespace gyre::python
