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
// Created on first use and never destroyed (its threads are detached).
//
// Interpreter exit: a thread that asks for the GIL once the interpreter
// finalises is ended by CPython with pthread_exit(), whose forced unwinding
// through C++ frames (ours, or torch's when a callable completes a torch
// future) calls std::terminate: the job aborts after correct results. So
// stop() runs from an atexit hook, before finalisation: the callables queued
// until then still run, then every thread ends and stop() returns once none
// is left. After that nothing takes the GIL: a callable posted later is
// dropped (its reference is leaked, as the interpreter is going away).
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
      if (stopped_) return;  // the interpreter is exiting: see the class comment
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

  // Runs the queued callables, then ends every thread; returns once none is
  // left, or after kStopWait if a callable does not return (then says so on
  // stderr). Main thread at exit (atexit), GIL held on entry; released while
  // waiting so that the threads can finish their callables.
  void stop() {
    int left = 0;
    std::deque<PyObject*> dropped;
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
      gone_cv_.wait_for(lock, kStopWait, [&] { return threads_ == 0; });
      stopped_ = true;
      left = threads_;
      // What is still queued has no thread left to run it: drop it below,
      // with the GIL (nothing is queued when every thread ended).
      dropped.swap(queue_);
    }
    for (PyObject* fn : dropped) Py_DECREF(fn);
    if (left > 0) {
      PySys_WriteStderr(
          "gyre: %d completion callback(s) still running at exit after %d s; exiting "
          "without waiting for them\n",
          left, static_cast<int>(kStopWait.count()));
    }
  }

 private:
  static constexpr int kMaxThreads = 32;
  static constexpr std::chrono::seconds kIdleExit{10};
  static constexpr std::chrono::seconds kStopWait{30};

  static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
  }

  // Ends the calling thread's membership of the pool. mu_ held.
  void leave() {
    --threads_;
    if (threads_ == 0) gone_cv_.notify_all();
  }

  void run() {
    for (;;) {
      PyObject* fn = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        const bool work =
            cv_.wait_for(lock, kIdleExit, [&] { return !queue_.empty() || stopping_; });
        --idle_;
        if (queue_.empty()) {
          if (stopping_ || (!work && threads_ > 1)) {
            leave();
            return;
          }
          continue;
        }
        // Before stop() gave up on the threads (stopped_), the interpreter
        // has not begun to finalise: taking the GIL is safe. The check of
        // finalizing() covers an exit that did not run the atexit hooks.
        if (stopped_ || finalizing()) {
          leave();
          return;  // the reference is dropped with the interpreter
        }
        fn = queue_.front();
        queue_.pop_front();
      }
      {
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
  }

  friend void fork_prepare();
  friend void fork_parent();
  friend void fork_child();

  std::mutex mu_;  // guards queue_, idle_, threads_, stopping_, stopped_
  std::condition_variable cv_;       // work queued, or stopping_
  std::condition_variable gone_cv_;  // threads_ reached 0
  std::deque<PyObject*> queue_;
  int idle_ = 0;     // threads waiting for work
  int threads_ = 0;  // threads started and not ended
  bool stopping_ = false;  // stop() called: threads end once the queue is empty
  bool stopped_ = false;   // stop() returned: nothing takes the GIL any more
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

void register_exit_hook() {
  // Registered when the module is imported, before gyre's own hook (which
  // shuts the runtime down, failing what is in flight), so it runs after
  // it: atexit runs its hooks last registered first. The callables of the
  // failed operations then still run before the threads end.
  py::module_::import("atexit").attr("register")(
      py::cpp_function([] { CallbackThreads::instance().stop(); }));
}

void drain_graveyard() {
  Imports dead;
  {
    std::lock_guard<std::mutex> lock(graveyard_mutex());
    dead.swap(graveyard());
  }
  dead.clear();  // deleters run here, with the GIL held
}

Completion::~Completion() { bury(std::move(keep)); }

void Completion::finish() {
  Imports mine;
  bool succeeded = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!done) return;
    mine.swap(keep);
    succeeded = ok;
  }
  std::string error;
  if (succeeded) {
    for (auto& t : mine) {
      std::string e = t->write_back();
      if (error.empty()) error = std::move(e);
    }
  }
  mine.clear();  // GIL held: the deleters may run here
  if (!error.empty()) {
    std::lock_guard<std::mutex> lock(mu);
    if (write_back_error.empty()) write_back_error = std::move(error);
  }
}

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
    op->handle_.on_complete([c](std::exception_ptr error) {
      Imports done;
      {
        std::lock_guard<std::mutex> lock(c->mu);
        c->done = true;
        c->ok = error == nullptr;
        bool write_back = false;
        for (auto& t : c->keep) {
          t->mark_completed(c->ok);
          write_back = write_back || t->needs_write_back();
        }
        // Results to copy back wait for a Python thread (finish()).
        if (!c->ok || !write_back) done.swap(c->keep);
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

bool PendingOp::poll() const {
  if (!handle_.poll()) return false;
  {
    std::lock_guard<std::mutex> lock(completion_->mu);
    if (!completion_->done) return false;  // the completion callback is running
  }
  completion_->finish();
  return true;
}

bool PendingOp::waits_run_rounds() {
  static const bool drive = !gyre::elastic_enabled();
  return drive;
}

void PendingOp::wait() const {
  using namespace std::chrono_literals;
  for (;;) {
    bool done = false;
    {
      // Completed already (a second wait, a caller that polled): the GIL
      // stays.
      std::lock_guard<std::mutex> lock(completion_->mu);
      done = completion_->done;
    }
    if (done) break;
    {
      py::gil_scoped_release release;
      // The runtime's wait first: this thread may run the rounds that
      // complete the operation (GYRE_CALLER_ROUNDS) instead of being woken
      // by the background thread. The completion callback then runs here
      // too, or is running on the thread that completed it. Not in a job
      // with fault tolerance on (ULFM): there a survivor of a rank's death
      // was lost with its job in about 1 of 10 runs of
      // tests/elastic/elastic_partial_local_sgd.py with Python's waits
      // running rounds, and in none of 20 without (cause not found;
      // docs/architecture.md, "Threads").
      if (!waits_run_rounds() || handle_.wait_for(50ms)) {
        std::unique_lock<std::mutex> lock(completion_->mu);
        done = completion_->cv.wait_for(lock, 50ms, [&] { return completion_->done; });
      }
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  completion_->finish();
  drain_graveyard();
  // Completed: wait() returns at once, or rethrows the operation's error.
  handle_.wait();
  std::string error;
  {
    std::lock_guard<std::mutex> lock(completion_->mu);
    error = completion_->write_back_error;
  }
  if (!error.empty()) throw InvalidArgument(error);
}

}  // namespace gyre::python
