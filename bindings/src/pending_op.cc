#include "pending_op.h"

#include <atomic>
#include <chrono>

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
