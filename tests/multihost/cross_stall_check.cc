// Run at 2 hosts x 2 ranks with GYRE_OP_TIMEOUT_S set low and the
// hierarchical allreduce unpipelined: the ranks of host 1 freeze (SIGSTOP,
// like a host that stops answering without closing its connections) while a
// 64 MiB allreduce is in its network phase. The ranks of host 0 wait for them
// over the cross-host transport, and must reach GYRE_OP_TIMEOUT_S there,
// name the allreduce and abort the job, not wait forever. The test passes on
// host 0's message; a rank that gets past the allreduce exits 1.
#include <csignal>
#include <cstdio>
#include <thread>
#include <vector>

#include "gyre/gyre.h"
#include "gyre/view.h"

using namespace gyre;

int main() {
  init();
  std::vector<float> small(1024, 1.0f);
  allreduce_async("cross_stall.warm", view(small), view(small), ReduceOp::kSum).wait();
  std::vector<float> big(std::size_t{16} << 20, 1.0f);  // 64 MiB
  Handle h = allreduce_async("cross_stall.big", view(big), view(big), ReduceOp::kSum);
  if (cross_rank() == 1) {
    // The allreduce's negotiation takes well under a millisecond and its
    // network phase about half a second at 1 Gbit/s: freeze inside it.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::raise(SIGSTOP);
  }
  try {
    h.wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: the allreduce failed: %s\n", rank(), e.what());
    shutdown();
    return 0;
  }
  std::fprintf(stderr, "rank %d: the allreduce completed although host 1 froze\n", rank());
  return 1;
}
