// MpiStoreChannel (gyre/collectives/mpi_store_channel.h) over a communicator
// of the store's ranks.
#include "gyre/collectives/mpi_store_channel.h"

#include "mpi_comm.h"

#include <climits>
#include <cstring>
#include <list>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "gyre/collectives/mpi_transport.h"
#include "gyre/collectives/naps.h"
#include "gyre/error.h"

namespace gyre::transport {

namespace {

constexpr const char* kWho = "parameter store";

void check(int code, MPI_Comm comm, const char* call, int peer) {
  detail::check_peer_call(code, comm, kWho, call, peer);
}

int checked_count(std::size_t bytes) { return detail::byte_count(bytes, kWho); }

// Polls `req` until it completes or `deadline` passes: without sleeping for
// the first 200 us (a reply within microseconds is the common case, and a
// sleep costs at least a timer tick, ~50-60 us), then in growing naps of at
// most 200 us so that a waiting rank leaves the core to the ranks that
// compute.
bool poll_until(MPI_Request& req, MPI_Comm comm, int peer, MPI_Status* st,
                MpiStoreChannel::Clock::time_point deadline,
                const std::function<void()>& interrupt) {
  using Clock = MpiStoreChannel::Clock;
  const auto spin_until = Clock::now() + std::chrono::microseconds(200);
  auto nap = std::chrono::microseconds(50);
  auto next_interrupt_check = Clock::now() + std::chrono::milliseconds(50);
  collectives::PreciseNaps precise;  // naps.h
  for (;;) {
    int done = 0;
    check(MPI_Test(&req, &done, st), comm, "MPI_Test", peer);
    if (done) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if (interrupt && now >= next_interrupt_check) {
      interrupt();
      next_interrupt_check = now + std::chrono::milliseconds(50);
    }
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      precise.begin();
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  }
}

}  // namespace

struct MpiStoreChannel::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  std::uint64_t made_at = 0;  // detail::failure_epoch() when comm was made
  // Gathered messages whose send was given up at its deadline: MPI may
  // still read them, so they live as long as the channel.
  std::mutex abandoned_mu;  // guards abandoned
  std::list<std::vector<std::byte>> abandoned;
};

struct MpiStoreChannel::Receive::State {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  int peer = -1;
};

MpiStoreChannel::Receive::Receive(std::unique_ptr<State> s) : state_(std::move(s)) {}

MpiStoreChannel::Receive::~Receive() {
  if (state_->req == MPI_REQUEST_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Cancel(&state_->req);
  MPI_Wait(&state_->req, MPI_STATUS_IGNORE);  // a cancelled receive completes at once
}

std::size_t MpiStoreChannel::Receive::wait(Clock::time_point deadline,
                                           const std::function<void()>& interrupt) {
  MPI_Status st;
  if (!poll_until(state_->req, state_->comm, state_->peer, &st, deadline, interrupt)) {
    throw TimeoutError(fmt::format("parameter store: no answer from rank {} within its deadline",
                                   state_->peer));
  }
  int n = 0;
  MPI_Get_count(&st, MPI_BYTE, &n);
  return static_cast<std::size_t>(n);
}

std::unique_ptr<MpiStoreChannel> MpiStoreChannel::create(const std::vector<int>& world_ranks,
                                                         int tag) {
  if (!MpiWorld::instance().thread_multiple()) {
    throw TransportError(
        "the parameter store needs MPI at MPI_THREAD_MULTIPLE (its server thread calls MPI "
        "beside the runtime's); this MPI offers less");
  }
  auto impl = std::make_unique<Impl>();
  impl->made_at = detail::failure_epoch();
  impl->comm = detail::comm_of_ranks(detail::world_comm(), world_ranks, tag);
  detail::check_mpi(MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN),
                    "MPI_Comm_set_errhandler");
  return std::unique_ptr<MpiStoreChannel>(new MpiStoreChannel(std::move(impl)));
}

MpiStoreChannel::MpiStoreChannel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  MPI_Comm_rank(impl_->comm, &rank_);
  MPI_Comm_size(impl_->comm, &size_);
}

MpiStoreChannel::~MpiStoreChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // A send given up at its deadline may still be in MPI's hands: the
  // communicator (and its buffer) is then kept rather than freed under it.
  bool kept;
  {
    std::lock_guard<std::mutex> lock(impl_->abandoned_mu);
    kept = !impl_->abandoned.empty();
  }
  if (kept) {
    (void)impl_.release();  // deliberately leaked: MPI may still read the buffers
    return;
  }
  detail::free_comm(impl_->comm, impl_->made_at);  // kept after a failure
}

std::unique_ptr<MpiStoreChannel::Receive> MpiStoreChannel::post_receive(int peer, int tag,
                                                                        std::span<std::byte> out) {
  auto s = std::make_unique<Receive::State>();
  s->comm = impl_->comm;
  s->peer = peer;
  check(MPI_Irecv(out.data(), checked_count(out.size()), MPI_BYTE, peer, tag, impl_->comm,
                  &s->req),
        impl_->comm, "MPI_Irecv", peer);
  return std::unique_ptr<Receive>(new Receive(std::move(s)));
}

std::unique_ptr<MpiStoreChannel::Receive> MpiStoreChannel::post_receive(
    int peer, int tag, std::span<const std::span<std::byte>> parts) {
  std::vector<MPI_Aint> at;
  std::vector<int> lengths;
  std::size_t total = 0;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    MPI_Aint address = 0;
    detail::check_mpi(MPI_Get_address(p.data(), &address), "MPI_Get_address");
    at.push_back(address);
    lengths.push_back(checked_count(p.size()));
    total += p.size();
  }
  checked_count(total);
  if (at.size() <= 1) {  // one place (or none): a plain receive
    std::span<std::byte> only;
    for (const auto& p : parts) {
      if (!p.empty()) only = p;
    }
    return post_receive(peer, tag, only);
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  detail::check_mpi(MPI_Type_create_hindexed(static_cast<int>(at.size()), lengths.data(),
                                             at.data(), MPI_BYTE, &type),
                    "MPI_Type_create_hindexed");
  detail::check_mpi(MPI_Type_commit(&type), "MPI_Type_commit");
  auto s = std::make_unique<Receive::State>();
  s->comm = impl_->comm;
  s->peer = peer;
  const int rc = MPI_Irecv(MPI_BOTTOM, 1, type, peer, tag, impl_->comm, &s->req);
  MPI_Type_free(&type);  // the pending receive keeps what it needs
  check(rc, impl_->comm, "MPI_Irecv", peer);
  return std::unique_ptr<Receive>(new Receive(std::move(s)));
}

void MpiStoreChannel::send(int peer, int tag, std::span<const std::span<const std::byte>> parts,
                           Clock::time_point deadline) {
  // Always one owned buffer: a send given up at its deadline stays in MPI's
  // hands, so it must not point into the caller's memory.
  std::size_t total = 0;
  for (const auto& p : parts) total += p.size();
  std::vector<std::byte> gathered(total);
  std::size_t at = 0;
  for (const auto& p : parts) {
    if (!p.empty()) std::memcpy(gathered.data() + at, p.data(), p.size());
    at += p.size();
  }
  send(peer, tag, std::move(gathered), deadline);
}

void MpiStoreChannel::send(int peer, int tag, std::vector<std::byte>&& message,
                           Clock::time_point deadline) {
  std::vector<std::byte> gathered = std::move(message);
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Isend(gathered.data(), checked_count(gathered.size()), MPI_BYTE, peer, tag,
                  impl_->comm, &req),
        impl_->comm, "MPI_Isend", peer);
  if (poll_until(req, impl_->comm, peer, MPI_STATUS_IGNORE, deadline, {})) return;
  // Not taken within the deadline: MPI cannot cancel a send, so it keeps
  // the request (freed; it completes on its own) and the bytes.
  MPI_Request_free(&req);
  {
    std::lock_guard<std::mutex> lock(impl_->abandoned_mu);
    impl_->abandoned.push_back(std::move(gathered));
  }
  throw TimeoutError(
      fmt::format("parameter store: rank {} did not take a message within its deadline", peer));
}

std::vector<int> MpiStoreChannel::failed_ranks() const {
  return detail::failed_ranks(impl_->comm);
}

std::optional<int> MpiStoreChannel::receive_any(int tag, std::vector<std::byte>& out) {
  int flag = 0;
  MPI_Message msg;
  MPI_Status st;
  check(MPI_Improbe(MPI_ANY_SOURCE, tag, impl_->comm, &flag, &msg, &st), impl_->comm,
        "MPI_Improbe", -1);
  if (!flag) return std::nullopt;
  int n = 0;
  MPI_Get_count(&st, MPI_BYTE, &n);
  out.resize(static_cast<std::size_t>(n));
  check(MPI_Mrecv(out.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE), impl_->comm, "MPI_Mrecv",
        st.MPI_SOURCE);
  return st.MPI_SOURCE;
}

}  // namespace gyre::transport
