// One enqueued operation as Python sees it: the gyre::Handle, and the
// imported tensors that must stay alive until the operation completes.
//
// Lifetime: the tensors are owned by a Completion shared between the
// PendingOp (the Python handle object) and the completion callback the
// runtime holds, so dropping the Python handle early never frees memory the
// background thread still uses. On completion the callback (background
// thread, no GIL) moves the tensors to a graveyard; they are destroyed on a
// Python thread holding the GIL, by drain_graveyard(), which every binding
// entry point calls and which is also scheduled with Py_AddPendingCall. The
// background thread therefore never waits for the GIL, and producers'
// deleters (torch's may touch Python objects) always run with it held.
//
// Staged torch tensors (tensor_import.h): the runtime works on gyre's copy
// of a torch tensor, so nothing done to the caller's tensor in flight
// (resize_, set_, del, a storage resize) can make it touch freed memory, and
// the other ranks receive the values as they were at the call. A result to
// be copied back into the caller's tensor is not buried on completion: the
// first of wait(), a poll() that returns true, or the Completion's end
// writes it back, on a Python thread with the GIL, only if the tensor still
// has its memory and shape; wait() then raises InvalidArgument for a tensor
// that did not (the other ranks have their results). A successful
// operation's results are in the caller's tensors when wait() returns or
// poll() returns true.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gyre/gyre.h"
#include "tensor_import.h"

namespace gyre::python {

using Imports = std::vector<std::unique_ptr<ImportedTensor>>;

// Destroys the tensors of completed operations. GIL held.
void drain_graveyard();
// Keeps this file's mutexes usable in the child of a fork(); called once,
// when the module is imported.
void register_fork_handlers();
// Stops gyre's callback threads at interpreter exit, before finalisation
// (an atexit hook; see CallbackThreads in pending_op.cc); called once, when
// the module is imported.
void register_exit_hook();

struct Completion {
  std::mutex mu;  // guards done, ok, keep, write_back_error
  std::condition_variable cv;
  bool done = false;
  bool ok = false;  // the operation succeeded (valid once done)
  Imports keep;
  std::string write_back_error;  // the first tensor finish() could not write
  // Once done: writes staged results back into the callers' tensors and
  // destroys the tensors. GIL held.
  void finish();
  ~Completion();  // hands any tensors still held to the graveyard
};

class PendingOp {
 public:
  // Runs `enqueue` with the GIL released, then ties `keep` to the handle's
  // completion. GIL held on entry.
  static std::shared_ptr<PendingOp> start(Imports keep, const std::function<Handle()>& enqueue);

  // Whether wait() runs the runtime's rounds (Handle::wait_for), which is
  // what gyre::WaitFollows asks of a waiter: not in a job with fault
  // tolerance on (see wait()).
  static bool waits_run_rounds();
  // True once the operation has completed (successfully or not) and its
  // results are in the caller's tensors. GIL held.
  bool poll() const;
  // Waits with the GIL released, waking every 50 ms to let Python handle
  // signals (Ctrl-C raises KeyboardInterrupt; the operation stays in flight
  // with its tensors kept alive). Rethrows the operation's error, or raises
  // InvalidArgument if a tensor's result could not be written back.
  void wait() const;
  const Handle& handle() const { return handle_; }

  // Calls `fn()` (no arguments) once the operation has completed, on one
  // of gyre's callback threads with the GIL held; queued at once if already
  // complete. The background thread only queues the call: it never waits for
  // the GIL. `fn` may block on other operations (another callback thread
  // then runs their callbacks). An exception `fn` raises is reported as unraisable. GIL held on
  // entry.
  void add_done_callback(py::object fn) const;

 private:
  Handle handle_;
  std::shared_ptr<Completion> completion_;
};

}  // namespace gyre::python
