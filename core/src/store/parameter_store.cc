// ParameterStore (gyre/store.h): the store's life (construction, close,
// destruction, shutdown's stop of the stores left open) and the tensors'
// registration, placement and shards. Pull and push (the client side) are
// in store_client.cc, the server thread that answers the requests for this
// member's shards in store_server.cc, the protocol and the shared state in
// store_impl.h.
#include "gyre/store.h"

#include "store/parameter_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "store/placement.h"
#include "store/store_impl.h"

namespace gyre {

namespace {

using core::store::kChannelTagBase;
using core::store::Shard;
using core::store::ShardSpan;
using transport::MpiStoreChannel;

}  // namespace

namespace {

std::mutex g_stores_mu;  // guards g_stores
std::set<std::shared_ptr<ParameterStore::Impl>>* g_stores =
    new std::set<std::shared_ptr<ParameterStore::Impl>>();  // never destroyed: used at exit
std::atomic<int> g_stores_made{0};

void stop_server(ParameterStore::Impl& impl) {
  impl.open = false;
  impl.stop_server = true;
  {
    std::lock_guard<std::mutex> join(impl.server_join_mu);
    if (impl.server.joinable()) impl.server.join();
  }
  // Calls on other threads leave within a poll of their waits (Impl::await);
  // a send to a member that stopped serving may take until its deadline.
  const auto limit = ParameterStore::Impl::Clock::now() + std::chrono::seconds(30);
  while (impl.calls.load() > 0 && ParameterStore::Impl::Clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (impl.calls.load() > 0) {
    impl.log.warn("parameter store {}: {} call(s) on other threads still in progress 30 s after "
                  "it stopped", impl.store_index, impl.calls.load());
  }
}

}  // namespace

namespace core::store {

void stop_all_stores() {
  std::set<std::shared_ptr<ParameterStore::Impl>> stores;
  {
    std::lock_guard<std::mutex> lock(g_stores_mu);
    stores.swap(*g_stores);
  }
  for (const auto& s : stores) stop_server(*s);
}

}  // namespace core::store

ParameterStore::ParameterStore(int process_set, const StoreOptions& options)
    : impl_(std::make_shared<Impl>()) {
  impl_->process_set = process_set;
  impl_->options = options;
  impl_->members = process_set_ranks(process_set);  // throws for an unknown set
  const int me = rank();
  auto mine = std::find(impl_->members.begin(), impl_->members.end(), me);
  if (mine == impl_->members.end()) {
    throw InvalidArgument(fmt::format(
        "ParameterStore: rank {} is not in process set {}, whose ranks make the store", me,
        process_set));
  }
  impl_->my_index = static_cast<int>(mine - impl_->members.begin());
  const Options env = Options::from_env();
  impl_->timeout_s = options.timeout_s > 0 ? options.timeout_s : env.stall_shutdown_s;
  impl_->log = core::Logger(me, env.log_level);
  impl_->bytes_held.assign(impl_->members.size(), 0);
  // The members agree the store's index (the largest count of stores any of
  // them has made): a process's own count differs from its peers' once it
  // has made stores on a process set they are not in. The agreement is also
  // the barrier before the communicator is made: a member that never comes
  // fails gyre's allreduce at its stall deadline, not a hang in MPI.
  std::int64_t index = g_stores_made.load();
  const TensorView index_view{&index, DataType::kInt64, {1}};
  allreduce_async("gyre.store.new", index_view, index_view, ReduceOp::kMax, 1.0, 1.0, process_set)
      .wait();
  impl_->store_index = static_cast<int>(index);
  g_stores_made = impl_->store_index + 1;
  const int tag = kChannelTagBase + impl_->store_index % 1024;
  std::vector<int> world_ranks = impl_->members;
  impl_->channel = MpiStoreChannel::create(world_ranks, tag);
  Impl* raw = impl_.get();
  impl_->server = std::thread([raw] { raw->serve(); });
  std::lock_guard<std::mutex> lock(g_stores_mu);
  g_stores->insert(impl_);
}

ParameterStore::~ParameterStore() {
  if (!impl_) return;
  {
    std::lock_guard<std::mutex> lock(g_stores_mu);
    g_stores->erase(impl_);
  }
  // Not collective: an open store stops serving at once (the others'
  // requests for its shards then time out, naming this rank).
  stop_server(*impl_);
  if (impl_->closed) {
    impl_->channel.reset();
  } else {
    // The others may still send requests on the store's communicator:
    // freeing it under them (MPI_Comm_free is collective) is not allowed,
    // so it stays, unused, until MPI is finalised.
    (void)impl_->channel.release();
  }
}

void ParameterStore::close() {
  if (!impl_->open.load()) return;
  // Every member has finished its calls once all are here: no request for
  // this rank's shards can still come.
  barrier(impl_->process_set);
  {
    std::lock_guard<std::mutex> lock(g_stores_mu);
    g_stores->erase(impl_);
  }
  stop_server(*impl_);
  impl_->closed = true;
}

void ParameterStore::register_tensor(const std::string& name, const TensorView& value) {
  impl_->check_open("register_tensor");
  TensorView copy_view = value;
  std::vector<std::byte> copy;
  // Refusals travel with the broadcast: every member fails in the same round.
  if (copy_view.refusal.empty() && value.device.type != DeviceType::kCPU) {
    copy_view.refusal = fmt::format("the value of '{}' is on {}; the store takes CPU tensors", name,
                                    device_name(value.device.type));
  }
  {
    std::lock_guard<std::mutex> lock(impl_->tensors_mu);
    if (copy_view.refusal.empty() && impl_->by_name.count(name)) {
      copy_view.refusal = fmt::format("'{}' is already registered in this store", name);
    }
  }
  if (copy_view.refusal.empty()) {
    copy.resize(value.nbytes());
    if (!copy.empty()) std::memcpy(copy.data(), value.data, copy.size());
    copy_view.data = copy.data();
  }
  const std::string op_name = fmt::format("gyre.store.{}.{}", impl_->store_index, name);
  broadcast_async(op_name, copy_view, impl_->members[0], impl_->process_set).wait();

  auto t = std::make_shared<Impl::Tensor>();
  t->name = name;
  t->dtype = value.dtype;
  t->numel = value.numel();
  std::lock_guard<std::mutex> lock(impl_->tensors_mu);
  t->id = static_cast<std::uint32_t>(impl_->tensors.size());
  t->shards = core::store::place_tensor(t->numel, dtype_size(t->dtype), impl_->options.split_bytes,
                                        impl_->bytes_held);
  t->local.resize(t->shards.size());
  const std::size_t elem = dtype_size(t->dtype);
  for (std::size_t s = 0; s < t->shards.size(); ++s) {
    const ShardSpan& span = t->shards[s];
    if (span.owner != impl_->my_index) continue;
    t->local[s] = std::make_unique<Shard>(t->dtype, span.count,
                                          copy.data() + static_cast<std::size_t>(span.offset) * elem);
  }
  impl_->tensors.push_back(t);
  impl_->by_name.emplace(name, t);
}

std::vector<int> ParameterStore::shard_owners(const std::string& name) const {
  auto t = impl_->find(name, "shard_owners");
  std::vector<int> owners;
  for (const auto& s : t->shards) owners.push_back(impl_->members[s.owner]);
  return owners;
}

StoreStats ParameterStore::stats() const {
  StoreStats s;
  s.pulls = impl_->pulls;
  s.pushes = impl_->pushes;
  s.pushes_applied = impl_->applied;
  s.pushes_rejected = impl_->rejected;
  s.pushes_scaled = impl_->scaled;
  s.served_requests = impl_->served;
  s.max_lag_seen = impl_->max_lag;
  return s;
}

}  // namespace gyre
