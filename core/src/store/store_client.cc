// ParameterStore's pull and push (gyre/store.h): a call's shards grouped by
// owner, one request per owner for all of them, this member's own shards
// served on the calling thread; the replies awaited together. The server
// that answers the requests is in store_server.cc, the protocol in
// store_impl.h.
#include <algorithm>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "store/store_impl.h"

namespace gyre {

namespace {

using core::store::bytes_of;
using core::store::EntryReply;
using core::store::kErrorTextMax;
using core::store::kRequestTag;
using core::store::PushOutcome;
using core::store::ReplyHeader;
using core::store::ReplyStatus;
using core::store::RequestEntry;
using core::store::RequestHeader;
using core::store::RequestKind;
using Impl = ParameterStore::Impl;

void check_matches(const Impl::Tensor& t, const TensorView& v, const char* call,
                   const char* what) {
  if (!v.refusal.empty()) throw InvalidArgument(fmt::format("ParameterStore::{}: {}", call, v.refusal));
  if (v.device.type != DeviceType::kCPU) {
    throw InvalidArgument(fmt::format("ParameterStore::{}('{}'): {} is on {}; the store takes CPU "
                                      "tensors", call, t.name, what, device_name(v.device.type)));
  }
  if (v.data == nullptr && v.numel() > 0) {
    throw InvalidArgument(fmt::format("ParameterStore::{}('{}'): {} has no data", call, t.name,
                                      what));
  }
  if (v.dtype != t.dtype || v.numel() != t.numel) {
    throw InvalidArgument(fmt::format(
        "ParameterStore::{}('{}'): {} is {} with {} elements; the tensor was registered as {} "
        "with {}", call, t.name, what, dtype_name(v.dtype), v.numel(), dtype_name(t.dtype),
        t.numel));
  }
}

template <typename Item>
Impl::CallName call_name(const char* call, const std::vector<Item>& items) {
  std::vector<std::string> quoted;
  for (const auto& i : items) quoted.push_back("'" + i.name + "'");
  return {call, fmt::format("{}", fmt::join(quoted, ", ")), items.size() > 1};
}

// The parts of item `item`: every shard of `t` (those `selected` says, if
// given), its bytes in the caller's tensor at `base`.
void add_parts(std::vector<Impl::Part>& parts, std::size_t item, const Impl::Tensor& t,
               std::byte* base, const std::vector<bool>* selected) {
  const std::size_t elem = dtype_size(t.dtype);
  for (std::size_t s = 0; s < t.shards.size(); ++s) {
    if (selected != nullptr && !(*selected)[s]) continue;
    Impl::Part p;
    p.item = item;
    p.tensor = &t;
    p.shard = static_cast<int>(s);
    p.bytes = base + static_cast<std::size_t>(t.shards[s].offset) * elem;
    p.nbytes = static_cast<std::size_t>(t.shards[s].count) * elem;
    parts.push_back(p);
  }
}

}  // namespace

std::string ParameterStore::Impl::owner_text(const CallName& c, const Outstanding& o) const {
  const Part& p = o.parts.front();
  std::string text = fmt::format("rank {}, owner of shard {}", members[o.owner], p.shard);
  if (c.several) text += fmt::format(" of '{}'", p.tensor->name);
  if (o.parts.size() > 1) text += fmt::format(" and {} more shards", o.parts.size() - 1);
  return text;
}

std::vector<ParameterStore::Impl::Outstanding> ParameterStore::Impl::send_requests(
    const CallName& c, RequestKind kind, const std::vector<Part>& parts) {
  std::vector<Outstanding> out;
  for (const Part& p : parts) {
    const int owner = p.tensor->shards[static_cast<std::size_t>(p.shard)].owner;
    if (owner == my_index) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const Outstanding& o) {
      return o.owner == owner;
    });
    if (it == out.end()) {
      out.emplace_back();
      out.back().owner = owner;
      it = out.end() - 1;
    }
    it->parts.push_back(p);
  }
  for (Outstanding& o : out) {
    const int tag = reply_tag();
    o.reply.resize(sizeof(ReplyHeader) +
                   std::max(o.parts.size() * sizeof(EntryReply), kErrorTextMax));
    o.receive = channel->post_receive(o.owner, tag, o.reply);
    std::vector<RequestEntry> entries;
    std::vector<std::span<std::byte>> values;  // a pull's destinations
    std::vector<std::span<const std::byte>> message(1);
    std::size_t value_bytes = 0;
    for (const Part& p : o.parts) {
      entries.push_back({p.tensor->id, static_cast<std::uint32_t>(p.shard), p.base, p.staleness,
                         static_cast<std::uint32_t>(p.policy), 0});
      value_bytes += p.nbytes;
      if (kind == RequestKind::kPull) values.emplace_back(p.bytes, p.nbytes);
    }
    if (kind == RequestKind::kPull && value_bytes > 0) {
      o.data = channel->post_receive(o.owner, tag, values);
    }
    const RequestHeader req{kind, static_cast<std::uint32_t>(entries.size()), tag, 0};
    message[0] = bytes_of(req);
    message.emplace_back(reinterpret_cast<const std::byte*>(entries.data()),
                         entries.size() * sizeof(RequestEntry));
    if (kind == RequestKind::kPush) {
      for (const Part& p : o.parts) message.emplace_back(p.bytes, p.nbytes);
    }
    try {
      channel->send(o.owner, kRequestTag, message, deadline());
    } catch (const TimeoutError&) {
      throw TimeoutError(fmt::format("ParameterStore::{}({}): {}, did not take the request "
                                     "within {} s", c.call, c.names, owner_text(c, o), timeout_s));
    } catch (const RankFailedError& e) {
      throw_member_failed(c, o, e);
    }
  }
  return out;
}

void ParameterStore::Impl::await(
    const CallName& c, std::vector<Outstanding>& out,
    const std::function<void(const Part&, const EntryReply&)>& take) {
  const auto limit = deadline();
  // The store closed under the call (shutdown() on another thread): its
  // owners no longer answer; give up now rather than at the deadline.
  const auto closing = [this, &c] {
    if (!open.load()) {
      throw StateError(fmt::format("ParameterStore::{}({}): the store was closed during the call "
                                   "(close(), or gyre was shut down)", c.call, c.names));
    }
  };
  auto wait = [&](Outstanding& o, MpiStoreChannel::Receive& r) -> std::size_t {
    try {
      return r.wait(limit, closing);
    } catch (const TimeoutError&) {
      throw TimeoutError(fmt::format(
          "ParameterStore::{}({}): {}, did not answer within {} s (dead, or not serving: closed "
          "its store or shut gyre down)", c.call, c.names, owner_text(c, o), timeout_s));
    } catch (const RankFailedError& e) {
      throw_member_failed(c, o, e);
    }
  };
  for (Outstanding& o : out) {
    const std::size_t got = wait(o, *o.receive);
    o.receive.reset();
    ReplyHeader h{};
    if (got < sizeof h) {
      throw TransportError(fmt::format("ParameterStore::{}({}): a reply of {} bytes from rank {}",
                                       c.call, c.names, got, members[o.owner]));
    }
    std::memcpy(&h, o.reply.data(), sizeof h);
    if (h.status == ReplyStatus::kError) {
      throw InvalidArgument(fmt::format(
          "ParameterStore::{}({}): {}, refused it: {}", c.call, c.names, owner_text(c, o),
          std::string(reinterpret_cast<const char*>(o.reply.data() + sizeof h), got - sizeof h)));
    }
    if (h.entries != o.parts.size() || got != sizeof h + o.parts.size() * sizeof(EntryReply)) {
      throw TransportError(fmt::format("ParameterStore::{}({}): rank {} answered {} entries in {} "
                                       "bytes to a request of {}", c.call, c.names,
                                       members[o.owner], h.entries, got, o.parts.size()));
    }
    if (o.data) {
      std::size_t want = 0;
      for (const Part& p : o.parts) want += p.nbytes;
      const std::size_t n = wait(o, *o.data);
      o.data.reset();
      if (n != want) {
        throw TransportError(fmt::format("ParameterStore::{}({}): rank {} sent {} bytes of "
                                         "values, not {}", c.call, c.names, members[o.owner], n,
                                         want));
      }
    }
    for (std::size_t i = 0; i < o.parts.size(); ++i) {
      EntryReply e{};
      std::memcpy(&e, o.reply.data() + sizeof h + i * sizeof e, sizeof e);
      take(o.parts[i], e);
    }
  }
}

std::vector<std::string> ParameterStore::Impl::dead_members(Clock::time_point limit) const {
  std::vector<int> dead = channel ? channel->failed_ranks() : std::vector<int>{};
  while (channel && dead.empty() && Clock::now() < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    dead = channel->failed_ranks();
  }
  std::vector<std::string> names;
  for (int d : dead) names.push_back(fmt::format("rank {} failed", members[static_cast<std::size_t>(d)]));
  return names;
}

void ParameterStore::Impl::throw_member_failed(const CallName& c, const Outstanding& o,
                                               const RankFailedError& e) {
  // The channel is revoked by whichever call saw the death first, so the
  // call that failed here may have been with a live member: ask ULFM which
  // one died. This process may learn of the death after the revocation
  // reached it (tens of ms here): wait for that, within the deadline and at
  // most 10 s.
  const std::vector<std::string> names =
      dead_members(std::min(deadline(), Clock::now() + std::chrono::seconds(10)));
  const std::string request =
      fmt::format("the request to {}, was not answered: {}", owner_text(c, o), e.what());
  if (names.empty()) {
    throw RankFailedError(fmt::format("ParameterStore::{}({}): a member of the store failed "
                                      "(which one is not known on this rank); {}", c.call,
                                      c.names, request));
  }
  throw RankFailedError(fmt::format("ParameterStore::{}({}): {} (a member's death ends the "
                                    "store on every member); {}", c.call, c.names,
                                    fmt::join(names, ", "), request));
}

std::vector<std::int64_t> ParameterStore::pull(const std::string& name, const TensorView& out) {
  return pull_many({PullItem{name, out}})[0];
}

void ParameterStore::check_members() const {
  if (!impl_->server_failed.load(std::memory_order_acquire)) return;
  std::string text = fmt::format(
      "ParameterStore: this rank's store server stopped: {}; the store cannot go on",
      impl_->server_failure);
  if (!impl_->server_failure_rank) throw StateError(text);
  // The server's wait for any member's request failed: ULFM knows which
  // member died (the error itself names none).
  const std::vector<std::string> names = impl_->dead_members(
      std::min(impl_->deadline(), Impl::Clock::now() + std::chrono::seconds(10)));
  if (!names.empty()) text = fmt::format("ParameterStore: {}; {}", fmt::join(names, ", "), text);
  throw RankFailedError(text);
}

std::vector<std::vector<std::int64_t>> ParameterStore::pull_many(
    const std::vector<PullItem>& items) {
  const Impl::CallScope scope(*impl_, "pull");
  const Impl::CallName c = call_name("pull", items);
  std::vector<std::shared_ptr<Impl::Tensor>> tensors;
  std::vector<Impl::Part> parts;
  std::vector<std::vector<std::int64_t>> versions;
  for (std::size_t i = 0; i < items.size(); ++i) {
    tensors.push_back(impl_->find(items[i].name, "pull"));
    check_matches(*tensors.back(), items[i].out, "pull", "the output");
    versions.emplace_back(tensors.back()->shards.size(), 0);
    add_parts(parts, i, *tensors.back(), static_cast<std::byte*>(items[i].out.data), nullptr);
  }
  impl_->pulls += static_cast<std::int64_t>(items.size());
  auto remote = impl_->send_requests(c, RequestKind::kPull, parts);
  for (const Impl::Part& p : parts) {
    const auto& local = p.tensor->local[static_cast<std::size_t>(p.shard)];
    if (local) versions[p.item][static_cast<std::size_t>(p.shard)] = local->read(p.bytes);
  }
  impl_->await(c, remote, [&](const Impl::Part& p, const EntryReply& e) {
    versions[p.item][static_cast<std::size_t>(p.shard)] = e.version;
  });
  return versions;
}

PushResult ParameterStore::push(const std::string& name, const TensorView& delta,
                                const std::vector<std::int64_t>& base_version,
                                std::int64_t staleness, PushPolicy policy,
                                const std::vector<int>& only_shards) {
  return push_many({PushItem{name, delta, base_version, staleness, policy, only_shards}})[0];
}

std::vector<PushResult> ParameterStore::push_many(const std::vector<PushItem>& items) {
  const Impl::CallScope scope(*impl_, "push");
  const Impl::CallName c = call_name("push", items);
  std::vector<std::shared_ptr<Impl::Tensor>> tensors;
  std::vector<Impl::Part> parts;
  std::vector<PushResult> results(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const PushItem& item = items[i];
    tensors.push_back(impl_->find(item.name, "push"));
    const Impl::Tensor& t = *tensors.back();
    check_matches(t, item.delta, "push", "the delta");
    const std::size_t shards = t.shards.size();
    if (item.base_version.size() != shards) {
      throw InvalidArgument(fmt::format(
          "ParameterStore::push('{}'): {} base versions for a tensor of {} shards (pass the "
          "versions pull() returned)", item.name, item.base_version.size(), shards));
    }
    if (item.policy != PushPolicy::kReject && item.policy != PushPolicy::kApply &&
        item.policy != PushPolicy::kScale) {
      throw InvalidArgument(fmt::format("ParameterStore::push('{}'): unknown policy {}", item.name,
                                        static_cast<int>(item.policy)));
    }
    std::vector<bool> selected(shards, item.only_shards.empty());
    for (int s : item.only_shards) {
      if (s < 0 || static_cast<std::size_t>(s) >= shards) {
        throw InvalidArgument(fmt::format("ParameterStore::push('{}'): shard {} of a tensor of {} "
                                          "shards", item.name, s, shards));
      }
      selected[static_cast<std::size_t>(s)] = true;
    }
    const std::size_t first = parts.size();
    add_parts(parts, i, t, static_cast<std::byte*>(item.delta.data), &selected);
    for (std::size_t k = first; k < parts.size(); ++k) {
      Impl::Part& p = parts[k];
      p.base = item.base_version[static_cast<std::size_t>(p.shard)];
      p.staleness = item.staleness < 0 ? -1 : item.staleness;
      p.policy = item.policy;
      const auto& local = t.local[static_cast<std::size_t>(p.shard)];
      if (!local) continue;
      try {  // before anything is sent: a refused call changes nothing
        local->check_push(p.base, p.policy);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(fmt::format("ParameterStore::push('{}'): shard {}: {}", item.name,
                                          p.shard, e.what()));
      }
    }
    PushResult& r = results[i];
    r.version = item.base_version;
    r.shard_applied.assign(shards, false);
    r.lag.assign(shards, 0);
    r.applied = true;
  }
  auto record = [&](const Impl::Part& p, const PushOutcome& o) {
    impl_->note_push(o);
    PushResult& r = results[p.item];
    const auto s = static_cast<std::size_t>(p.shard);
    r.version[s] = o.version;
    r.lag[s] = o.lag;
    r.shard_applied[s] = o.applied;
    if (!o.applied) {
      r.applied = false;
      r.rejected_shards.push_back(p.shard);
    }
  };
  auto remote = impl_->send_requests(c, RequestKind::kPush, parts);
  for (const Impl::Part& p : parts) {
    const auto& local = p.tensor->local[static_cast<std::size_t>(p.shard)];
    if (local) record(p, local->push(p.bytes, p.base, p.staleness, p.policy));
  }
  impl_->await(c, remote, [&](const Impl::Part& p, const EntryReply& e) {
    PushOutcome out;
    out.applied = e.status == ReplyStatus::kApplied;
    out.version = e.version;
    out.lag = e.lag;
    out.factor = e.factor;
    record(p, out);
  });
  for (PushResult& r : results) std::sort(r.rejected_shards.begin(), r.rejected_shards.end());
  return results;
}

}  // namespace gyre
