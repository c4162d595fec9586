// The parameter store's part of gyre's lifecycle: gyre::shutdown() (and the
// exit handler, and rebuild()) stops every store still open on this rank
// before the runtime and MPI go, so that no server thread calls MPI after
// MPI_Finalize. The store itself: gyre/store.h, parameter_store.cc.
#pragma once

namespace gyre::core::store {

// Stops the server thread of every open store of this process; their later
// calls throw StateError. Local (no communication). Any thread.
void stop_all_stores();

}  // namespace gyre::core::store
