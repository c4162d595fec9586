// The operations of gyre.h on an explicit Runtime (see operations.cc).
// Called on user threads; each validates, enqueues and returns at once
// (barrier, join, fingerprint_check and resync block until done).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gyre/gyre.h"
#include "runtime/runtime.h"

namespace gyre::core {

Handle allreduce_async(Runtime& rt, const std::string& name, const TensorView& in,
                       const TensorView& out, ReduceOp op = ReduceOp::kAverage,
                       double prescale = 1.0, double postscale = 1.0);
Handle grouped_allreduce_async(Runtime& rt, const std::vector<std::string>& names,
                               const std::vector<TensorView>& ins,
                               const std::vector<TensorView>& outs,
                               ReduceOp op = ReduceOp::kAverage, double prescale = 1.0,
                               double postscale = 1.0);
Handle allgather_async(Runtime& rt, const std::string& name, const TensorView& in);
Handle broadcast_async(Runtime& rt, const std::string& name, const TensorView& buf, int root);
Handle alltoall_async(Runtime& rt, const std::string& name, const TensorView& in,
                      const std::vector<std::int64_t>& splits = {});
Handle reducescatter_async(Runtime& rt, const std::string& name, const TensorView& in,
                           ReduceOp op = ReduceOp::kAverage, double prescale = 1.0,
                           double postscale = 1.0);
void barrier(Runtime& rt);
int join(Runtime& rt);
std::vector<FingerprintMismatch> fingerprint_check(Runtime& rt,
                                                   const std::vector<NamedBuffer>& buffers);
void resync(Runtime& rt, const std::vector<NamedBuffer>& buffers, ResyncPolicy policy);
// The four blocking calls above as operations (gyre.h: barrier_async).
Handle barrier_async(Runtime& rt);
Handle join_async(Runtime& rt);
Handle fingerprint_check_async(Runtime& rt, const std::vector<NamedBuffer>& buffers);
Handle resync_async(Runtime& rt, const std::vector<NamedBuffer>& buffers, ResyncPolicy policy);

// Enqueues one checked request with its views on `rt` and returns its
// handle: the last step of every operation above, also used by gyre's own
// operations (api/process_sets.cc). No argument checks: the caller made them.
Handle submit(Runtime& rt, Request req, const TensorView& in, const TensorView& out);

}  // namespace gyre::core
