// MpiP2pChannel (gyre/collectives/mpi_p2p.h) over its own duplicate of the
// world communicator.
#include "gyre/collectives/mpi_p2p.h"

#include "mpi_comm.h"

#include <climits>
#include <thread>
#include <string>

#include <fmt/format.h>

#include "gyre/collectives/mpi_transport.h"
#include "gyre/error.h"

namespace gyre::transport {

struct MpiP2pChannel::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  std::uint64_t made_at = 0;  // detail::failure_epoch() when comm was made
  // quiesce() gave up on its barrier: the request stays posted and the
  // communicator is never freed (see quiesce()).
  bool barrier_pending = false;
  struct Slot {
    MPI_Request req = MPI_REQUEST_NULL;
    int peer = -1;
    bool is_send = false;
    bool in_use = false;
  };
  std::vector<Slot> slots;           // indexed by Request
  std::vector<Request> free_slots;   // released, reused first

  // Throws for a failed MPI call: RankFailedError when a peer died (ULFM).
  void check(int code, const char* call, int peer) {
    detail::check_peer_call(code, comm, "point-to-point", call, peer);
  }

  Request take(MPI_Request req, int peer, bool is_send) {
    Request r;
    if (!free_slots.empty()) {
      r = free_slots.back();
      free_slots.pop_back();
    } else {
      r = static_cast<Request>(slots.size());
      slots.emplace_back();
    }
    slots[static_cast<std::size_t>(r)] = Slot{req, peer, is_send, true};
    return r;
  }

  Slot& lookup(Request r) {
    auto i = static_cast<std::size_t>(r);
    if (r < 0 || i >= slots.size() || !slots[i].in_use) {
      throw InvalidArgument(fmt::format("point-to-point: unknown request {}", r));
    }
    return slots[i];
  }

  void release(Request r) {
    slots[static_cast<std::size_t>(r)].in_use = false;
    free_slots.push_back(r);
  }
};

std::unique_ptr<MpiP2pChannel> MpiP2pChannel::create() {
  if (!MpiWorld::instance().thread_multiple()) {
    throw TransportError(
        "point-to-point operations need MPI at MPI_THREAD_MULTIPLE (their thread calls MPI "
        "beside the runtime's); this MPI offers less");
  }
  auto impl = std::make_unique<Impl>();
  impl->made_at = detail::failure_epoch();
  detail::check_mpi(MPI_Comm_dup(detail::world_comm(), &impl->comm), "MPI_Comm_dup");
  detail::check_mpi(MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN),
                    "MPI_Comm_set_errhandler");
  return std::unique_ptr<MpiP2pChannel>(new MpiP2pChannel(std::move(impl)));
}

MpiP2pChannel::MpiP2pChannel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  MPI_Comm_rank(impl_->comm, &rank_);
  MPI_Comm_size(impl_->comm, &size_);
}

MpiP2pChannel::~MpiP2pChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  bool cut_short = false;  // transfers still posted: peers may still send
  for (auto& s : impl_->slots) {
    if (!s.in_use) continue;
    cut_short = true;
    // A receive is cancelled; a send (which MPI cannot reliably cancel) is
    // left to complete on its own.
    if (!s.is_send) MPI_Cancel(&s.req);
    MPI_Request_free(&s.req);
  }
  if (!impl_->barrier_pending) detail::free_comm(impl_->comm, impl_->made_at, cut_short);
}

MpiP2pChannel::Request MpiP2pChannel::isend(int peer, int tag, std::span<const std::byte> data) {
  MPI_Request req;
  const int count = detail::byte_count(data.size(), "point-to-point");
  impl_->check(MPI_Isend(data.data(), count, MPI_BYTE, peer, tag, impl_->comm, &req), "MPI_Isend",
               peer);
  return impl_->take(req, peer, true);
}

MpiP2pChannel::Request MpiP2pChannel::irecv(int peer, int tag, std::span<std::byte> data) {
  MPI_Request req;
  const int count = detail::byte_count(data.size(), "point-to-point");
  impl_->check(MPI_Irecv(data.data(), count, MPI_BYTE, peer, tag, impl_->comm, &req), "MPI_Irecv",
               peer);
  return impl_->take(req, peer, false);
}

bool MpiP2pChannel::test(Request r, std::size_t* bytes) {
  auto& s = impl_->lookup(r);
  int done = 0;
  MPI_Status st;
  const int code = MPI_Test(&s.req, &done, &st);
  if (code != MPI_SUCCESS) {
    const int peer = s.peer;
    const bool is_send = s.is_send;
    impl_->release(r);
    impl_->check(code, is_send ? "MPI_Test (send)" : "MPI_Test (receive)", peer);
  }
  if (!done) return false;
  if (bytes != nullptr) {
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    *bytes = static_cast<std::size_t>(n);
  }
  impl_->release(r);
  return true;
}

void MpiP2pChannel::cancel(Request r) {
  auto& s = impl_->lookup(r);
  if (!s.is_send) {
    MPI_Cancel(&s.req);
    // A cancelled receive completes at once; waiting frees it.
    MPI_Wait(&s.req, MPI_STATUS_IGNORE);
  } else {
    MPI_Request_free(&s.req);
  }
  impl_->release(r);
}

std::optional<int> MpiP2pChannel::receive_any(int tag, std::vector<std::byte>& out) {
  int flag = 0;
  MPI_Message msg;
  MPI_Status st;
  impl_->check(MPI_Improbe(MPI_ANY_SOURCE, tag, impl_->comm, &flag, &msg, &st), "MPI_Improbe",
               -1);
  if (!flag) return std::nullopt;
  int n = 0;
  MPI_Get_count(&st, MPI_BYTE, &n);
  out.resize(static_cast<std::size_t>(n));
  impl_->check(MPI_Mrecv(out.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv",
               st.MPI_SOURCE);
  return st.MPI_SOURCE;
}

void MpiP2pChannel::quiesce(std::chrono::milliseconds limit) {
  MPI_Request barrier;
  if (MPI_Ibarrier(impl_->comm, &barrier) != MPI_SUCCESS) return;
  const auto end = std::chrono::steady_clock::now() + limit;
  std::vector<std::byte> scratch;
  bool barrier_done = false;
  for (;;) {
    // Discard whatever has arrived, on any tag.
    for (;;) {
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      if (MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, impl_->comm, &flag, &msg, &st) !=
              MPI_SUCCESS || !flag) {
        break;
      }
      int n = 0;
      MPI_Get_count(&st, MPI_BYTE, &n);
      scratch.resize(static_cast<std::size_t>(n));
      MPI_Mrecv(scratch.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    }
    bool sends_done = true;
    for (std::size_t i = 0; i < impl_->slots.size(); ++i) {
      auto& sl = impl_->slots[i];
      if (!sl.in_use || !sl.is_send) continue;
      int done = 0;
      if (MPI_Test(&sl.req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
        impl_->release(static_cast<Request>(i));
      } else {
        sends_done = false;
      }
    }
    if (!barrier_done) {
      int done = 0;
      if (MPI_Test(&barrier, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      barrier_done = done != 0;
    }
    if (barrier_done && sends_done) return;
    if (std::chrono::steady_clock::now() > end) {
      // A rank that has not come (it shuts down later, or never): the
      // barrier stays posted. MPI does not allow freeing the request of a
      // non-blocking collective (Open MPI aborts with MPI_ERR_REQUEST), and
      // Open MPI 4.1 still progresses it after the communicator is freed
      // (a crash in MPI_Finalize): so the communicator is kept, one per
      // such shutdown, and the barrier completes when the others quiesce.
      if (!barrier_done) impl_->barrier_pending = true;
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace gyre::transport
