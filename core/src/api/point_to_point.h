// send_async / recv_async of gyre.h: argument checks on the caller's thread,
// then the point-to-point engine (runtime/p2p_engine.h).
#pragma once

#include <cstdint>
#include <vector>

#include "gyre/gyre.h"
#include "runtime/p2p_engine.h"

namespace gyre::core {

// `set_ranks`: the world ranks of `process_set` (sorted); `self`: this
// rank's world rank. Throws InvalidArgument for a bad tensor (the caller's
// refusal, a CUDA tensor, a null buffer), a peer or this rank outside the
// set, or kAnySource for a send.
Handle point_to_point_async(P2pEngine& engine, bool is_send, const TensorView& t, int peer,
                            std::int64_t tag, int process_set,
                            const std::vector<int>& set_ranks, int self);

}  // namespace gyre::core
