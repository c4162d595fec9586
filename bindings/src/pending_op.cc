// Python handles of enqueued operations: keeping tensors alive until
// completion, waiting, and running Python callbacks on completion.
#include "pending_op.h"

#include <pthread.h>

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
// threads of their own, which take the GIL; the background thread only
// queues them. A callable may block on a later operation (torch's PowerSGD
// hook waits on an allreduce inside a future's callback), so when a callable
// is queued and no callback thread is idle, another one is started (up to
// kMaxThreads); threads beyond the first end after kIdleExit without work.
// Created on first use and never destroyed: its threads may still be parked
// on the queue while the interpreter exits.
class CallbackThreads {
 public:
  static CallbackThreads& instance() {
    static auto* t = new CallbackThreads();
    return *t;
  }

  // Takes over one reference to `fn`. Any thread; no GIL needed.
  void post(PyObject* fn) {
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(fn);
      if (idle_ == 0 && threads_ < kMaxThreads) {
        ++threads_;
        start = true;
      }
    }
    if (start) {
      std::thread([this] { run(); }).detach();
    } else {
      cv_.notify_one();
    }
  }

 private:
  static constexpr int kMaxThreads = 32;
  static constexpr std::chrono::seconds kIdleExit{10};

  static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
  }

  void run() {
    for (;;) {
      PyObject* fn = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        const bool work = cv_.wait_for(lock, kIdleExit, [&] { return !queue_.empty(); });
        --idle_;
        if (!work) {
          if (threads_ > 1) {
            --threads_;
            return;
          }
          continue;
        }
        fn = queue_.front();
        queue_.pop_front();
      }
      // Past this point taking the GIL would park the thread for good; the
      // reference is dropped with the interpreter.
      if (finalizing()) return;
      py::gil_scoped_acquire gil;
      PyObject* result = PyObject_CallNoArgs(fn);
      if (result == nullptr) {
        PyErr_WriteUnraisable(fn);
      } else {
        Py_DECREF(result);
      }
      Py_DECREF(fn);
      drain_graveyard();
    }
  }

  friend void fork_prepare();
  friend void fork_parent();
  friend void fork_child();

  std::mutex mu_;  // guards queue_, idle_, threads_
  std::condition_variable cv_;
  std::deque<PyObject*> queue_;
  int idle_ = 0;     // threads waiting for work
  int threads_ = 0;  // threads started and not ended
};

// fork(): the background thread (bury) and the callback threads take these
// mutexes without the GIL, so one of them may hold one at the moment another
// thread forks; the child, which has only the forking thread, would then
// wait for ever at its first binding call. The forking thread holds both
// across fork(). In the child the callback threads do not exist: the pool
// starts empty (their queued callables are dropped with their references).
void fork_prepare() {
  graveyard_mutex().lock();
  CallbackThreads::instance().mu_.lock();
}
void fork_parent() {
  CallbackThreads::instance().mu_.unlock();
  graveyard_mutex().unlock();
}
void fork_child() {
  auto& t = CallbackThreads::instance();
  t.queue_.clear();
  t.idle_ = 0;
  t.threads_ = 0;
  t.mu_.unlock();
  graveyard_mutex().unlock();
}

}  // namespace

void register_fork_handlers() { pthread_atfork(fork_prepare, fork_parent, fork_child); }

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
  handle_.on_complete([raw](std::exception_ptr) { CallbackThreads::instance().post(raw); });
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
