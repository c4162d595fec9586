// ParameterStore (gyre/store.h): the tensors' placement and shards, and the
// requests a member sends for shards other members own (the client side);
// the server thread that answers those for its own is in store_server.cc,
// the protocol and the shared state in store_impl.h.
#include "gyre/store.h"

#include "store/parameter_store.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <span>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "store/placement.h"
#include "store/store_impl.h"

namespace gyre {

namespace {

using core::store::bytes_of;
using core::store::kChannelTagBase;
using core::store::kErrorTextMax;
using core::store::kRequestTag;
using core::store::PushOutcome;
using core::store::ReplyHeader;
using core::store::ReplyStatus;
using core::store::RequestHeader;
using core::store::RequestKind;
using core::store::Shard;
using core::store::ShardSpan;
using transport::MpiStoreChannel;

}  // namespace

// Waits for every reply; throws the first failure, naming tensor, shard and
// owner (every receive is cancelled by its destructor on the way out).
void ParameterStore::Impl::await(
    const Tensor& t, std::vector<Outstanding>& out, const char* call,
    const std::function<void(Outstanding&, const ReplyHeader&, std::size_t)>& take) {
  const auto limit = deadline();
  for (auto& o : out) {
    std::size_t got = 0;
    try {
      got = o.receive->wait(limit);
    } catch (const TimeoutError&) {
      throw TimeoutError(fmt::format(
          "ParameterStore::{}('{}'): rank {}, owner of shard {}, did not answer within {} s "
          "(dead, or not serving: closed its store or shut gyre down)",
          call, t.name, members[o.owner], o.shard, timeout_s));
    } catch (const RankFailedError& e) {
      throw_member_failed(t, call, o, e);
    }
    o.receive.reset();
    ReplyHeader h{};
    if (got < sizeof h) {
      throw TransportError(fmt::format("ParameterStore::{}('{}'): a reply of {} bytes from rank {}",
                                       call, t.name, got, members[o.owner]));
    }
    std::memcpy(&h, o.reply.data(), sizeof h);
    if (h.status == ReplyStatus::kError) {
      throw InvalidArgument(fmt::format(
          "ParameterStore::{}('{}'): rank {}, owner of shard {}, refused it: {}", call, t.name,
          members[o.owner], o.shard,
          std::string(reinterpret_cast<const char*>(o.reply.data() + sizeof h), got - sizeof h)));
    }
    take(o, h, got - sizeof h);
  }
}

void ParameterStore::Impl::post_and_send(const Tensor& t, const char* call, Outstanding& o,
                                         const RequestHeader& req, std::size_t reply_bytes,
                                         std::span<const std::byte> payload) {
  o.reply.resize(std::max(sizeof(ReplyHeader) + reply_bytes, sizeof(ReplyHeader) + kErrorTextMax));
  o.receive = channel->post_receive(o.owner, req.reply_tag, o.reply);
  const std::span<const std::byte> parts[] = {bytes_of(req), payload};
  try {
    channel->send(o.owner, kRequestTag, parts, deadline());
  } catch (const TimeoutError&) {
    throw TimeoutError(fmt::format(
        "ParameterStore::{}('{}'): rank {}, owner of shard {}, did not take the request within "
        "{} s", call, t.name, members[o.owner], o.shard, timeout_s));
  } catch (const RankFailedError& e) {
    throw_member_failed(t, call, o, e);
  }
}

void ParameterStore::Impl::throw_member_failed(const Tensor& t, const char* call,
                                               const Outstanding& o, const RankFailedError& e) {
  // The channel is revoked by whichever call saw the death first, so the
  // call that failed here may have been with a live member: ask ULFM which
  // one died. This process may learn of the death after the revocation
  // reached it (tens of ms here): wait for that, within the deadline and at
  // most 10 s.
  const auto limit = std::min(deadline(), Clock::now() + std::chrono::seconds(10));
  std::vector<int> dead = channel->failed_ranks();
  while (dead.empty() && Clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    dead = channel->failed_ranks();
  }
  const std::string request =
      fmt::format("the request to rank {}, owner of shard {}, was not answered: {}",
                  members[o.owner], o.shard, e.what());
  if (dead.empty()) {
    throw RankFailedError(fmt::format("ParameterStore::{}('{}'): a member of the store failed "
                                      "(which one is not known on this rank); {}", call, t.name,
                                      request));
  }
  std::vector<std::string> names;
  for (int d : dead) names.push_back(fmt::format("rank {} failed", members[d]));
  throw RankFailedError(fmt::format("ParameterStore::{}('{}'): {} (a member's death ends the "
                                    "store on every member); {}", call, t.name,
                                    fmt::join(names, ", "), request));
}

namespace {

std::mutex g_stores_mu;  // guards g_stores
std::set<std::shared_ptr<ParameterStore::Impl>>* g_stores =
    new std::set<std::shared_ptr<ParameterStore::Impl>>();  // never destroyed: used at exit
std::atomic<int> g_stores_made{0};

void stop_server(ParameterStore::Impl& impl) {
  impl.open = false;
  impl.stop_server = true;
  if (impl.server.joinable()) impl.server.join();
}

void check_cpu(const TensorView& v, const char* call, const char* what) {
  if (!v.refusal.empty()) throw InvalidArgument(fmt::format("ParameterStore::{}: {}", call, v.refusal));
  if (v.device.type != DeviceType::kCPU) {
    throw InvalidArgument(fmt::format("ParameterStore::{}: {} is on {}; the store takes CPU tensors",
                                      call, what, device_name(v.device.type)));
  }
  if (v.data == nullptr && v.numel() > 0) {
    throw InvalidArgument(fmt::format("ParameterStore::{}: {} has no data", call, what));
  }
}

void check_matches(const ParameterStore::Impl::Tensor& t, const TensorView& v, const char* call,
                   const char* what) {
  check_cpu(v, call, what);
  if (v.dtype != t.dtype || v.numel() != t.numel) {
    throw InvalidArgument(fmt::format(
        "ParameterStore::{}('{}'): {} is {} with {} elements; the tensor was registered as {} "
        "with {}", call, t.name, what, dtype_name(v.dtype), v.numel(), dtype_name(t.dtype),
        t.numel));
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

std::vector<std::int64_t> ParameterStore::pull(const std::string& name, const TensorView& out) {
  impl_->check_open("pull");
  auto t = impl_->find(name, "pull");
  check_matches(*t, out, "pull", "the output");
  ++impl_->pulls;
  const std::size_t elem = dtype_size(t->dtype);
  auto* base = static_cast<std::byte*>(out.data);
  std::vector<std::int64_t> versions(t->shards.size(), 0);
  std::vector<Impl::Outstanding> remote;
  for (std::size_t s = 0; s < t->shards.size(); ++s) {
    const ShardSpan& span = t->shards[s];
    if (span.owner == impl_->my_index) continue;
    Impl::Outstanding o;
    o.shard = static_cast<int>(s);
    o.owner = span.owner;
    RequestHeader req{RequestKind::kPull, t->id, static_cast<std::uint32_t>(s), impl_->reply_tag(),
                      0, 0, 0, 0};
    impl_->post_and_send(*t, "pull", o, req, static_cast<std::size_t>(span.count) * elem, {});
    remote.push_back(std::move(o));
  }
  for (std::size_t s = 0; s < t->shards.size(); ++s) {
    if (t->local[s]) {
      versions[s] = t->local[s]->read(base + static_cast<std::size_t>(t->shards[s].offset) * elem);
    }
  }
  impl_->await(*t, remote, "pull", [&](Impl::Outstanding& o, const ReplyHeader& h, std::size_t n) {
    const ShardSpan& span = t->shards[static_cast<std::size_t>(o.shard)];
    const std::size_t want = static_cast<std::size_t>(span.count) * elem;
    if (n != want) {
      throw TransportError(fmt::format("ParameterStore::pull('{}'): rank {} sent {} bytes of shard "
                                       "{}, not {}", t->name, impl_->members[o.owner], n, o.shard,
                                       want));
    }
    if (n) std::memcpy(base + static_cast<std::size_t>(span.offset) * elem,
                       o.reply.data() + sizeof(ReplyHeader), n);
    versions[static_cast<std::size_t>(o.shard)] = h.version;
  });
  return versions;
}

PushResult ParameterStore::push(const std::string& name, const TensorView& delta,
                                const std::vector<std::int64_t>& base_version,
                                std::int64_t staleness, PushPolicy policy,
                                const std::vector<int>& only_shards) {
  impl_->check_open("push");
  auto t = impl_->find(name, "push");
  check_matches(*t, delta, "push", "the delta");
  const std::size_t shards = t->shards.size();
  if (base_version.size() != shards) {
    throw InvalidArgument(fmt::format(
        "ParameterStore::push('{}'): {} base versions for a tensor of {} shards (pass the versions "
        "pull() returned)", name, base_version.size(), shards));
  }
  if (policy != PushPolicy::kReject && policy != PushPolicy::kApply &&
      policy != PushPolicy::kScale) {
    throw InvalidArgument(fmt::format("ParameterStore::push('{}'): unknown policy {}", name,
                                      static_cast<int>(policy)));
  }
  std::vector<bool> selected(shards, only_shards.empty());
  for (int s : only_shards) {
    if (s < 0 || static_cast<std::size_t>(s) >= shards) {
      throw InvalidArgument(fmt::format("ParameterStore::push('{}'): shard {} of a tensor of {} "
                                        "shards", name, s, shards));
    }
    selected[static_cast<std::size_t>(s)] = true;
  }
  const std::size_t elem = dtype_size(t->dtype);
  const auto* data = static_cast<const std::byte*>(delta.data);
  PushResult result;
  result.version = base_version;
  result.shard_applied.assign(shards, false);
  result.lag.assign(shards, 0);
  result.applied = true;
  auto record = [&](std::size_t s, const PushOutcome& o) {
    impl_->note_push(o);
    result.version[s] = o.version;
    result.lag[s] = o.lag;
    result.shard_applied[s] = o.applied;
    if (!o.applied) {
      result.applied = false;
      result.rejected_shards.push_back(static_cast<int>(s));
    }
  };
  std::vector<Impl::Outstanding> remote;
  for (std::size_t s = 0; s < shards; ++s) {
    const ShardSpan& span = t->shards[s];
    if (!selected[s] || span.owner == impl_->my_index) continue;
    Impl::Outstanding o;
    o.shard = static_cast<int>(s);
    o.owner = span.owner;
    RequestHeader req{RequestKind::kPush, t->id, static_cast<std::uint32_t>(s), impl_->reply_tag(),
                      base_version[s], staleness < 0 ? -1 : staleness,
                      static_cast<std::uint32_t>(policy), 0};
    impl_->post_and_send(*t, "push", o, req, 0,
                         {data + static_cast<std::size_t>(span.offset) * elem,
                          static_cast<std::size_t>(span.count) * elem});
    remote.push_back(std::move(o));
  }
  for (std::size_t s = 0; s < shards; ++s) {
    if (!selected[s] || !t->local[s]) continue;
    try {
      record(s, t->local[s]->push(data + static_cast<std::size_t>(t->shards[s].offset) * elem,
                                  base_version[s], staleness < 0 ? -1 : staleness, policy));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("ParameterStore::push('{}'): shard {}: {}", name, s,
                                        e.what()));
    }
  }
  impl_->await(*t, remote, "push", [&](Impl::Outstanding& o, const ReplyHeader& h, std::size_t) {
    PushOutcome out;
    out.applied = h.status == ReplyStatus::kApplied;
    out.version = h.version;
    out.lag = h.lag;
    out.factor = h.factor;
    record(static_cast<std::size_t>(o.shard), out);
  });
  std::sort(result.rejected_shards.begin(), result.rejected_shards.end());
  return result;
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
