// The parameter store's server side: the thread of each store that answers
// the other members' pull and push requests for this member's shards (the
// protocol: store_impl.h).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "gyre/collectives/naps.h"
#include "store/store_impl.h"

namespace gyre {

using core::store::EntryReply;
using core::store::kErrorTextMax;
using core::store::kFirstReplyTag;
using core::store::kRequestTag;
using core::store::ReplyHeader;
using core::store::ReplyStatus;
using core::store::RequestEntry;
using core::store::RequestHeader;
using core::store::RequestKind;

void ParameterStore::Impl::serve() {
  collectives::precise_naps_for_this_thread();  // its naps between requests (naps.h)
  std::vector<std::byte> message;
  // Requests for a tensor this member has not finished registering: the
  // registration's broadcast can complete on the requester before the
  // owner has installed its shards. Ids follow the collective order of
  // registration, so such a request waits for a registration that every
  // member makes (or fails in the same round); the requester's deadline
  // bounds the wait.
  std::vector<std::pair<int, std::vector<std::byte>>> deferred;
  // After a request the server polls without sleeping for kHotSpell (a
  // sleep costs at least a timer tick, ~50-60 us here, more than a reply
  // on one host), then naps of growing length, at most 200 us, so that a
  // quiet store leaves the core to training.
  constexpr auto kHotSpell = std::chrono::microseconds(200);
  auto last_request = Clock::now();
  auto nap = std::chrono::microseconds(50);
  while (!stop_server.load(std::memory_order_relaxed)) {
    std::optional<int> source;
    try {
      source = channel->receive_any(kRequestTag, message);
    } catch (const std::exception& e) {
      log.error("parameter store: the server stops: {}", e.what());
      server_failure = e.what();
      server_failure_rank = dynamic_cast<const RankFailedError*>(&e) != nullptr;
      server_failed.store(true, std::memory_order_release);
      return;
    }
    if (source) {
      if (awaits_registration(message)) {
        deferred.emplace_back(*source, std::move(message));
        message = {};
      } else {
        answer(*source, message);
      }
      last_request = Clock::now();
      nap = std::chrono::microseconds(50);
    }
    if (!deferred.empty()) answer_deferred(deferred);
    if (source) continue;
    if (!deferred.empty() || Clock::now() - last_request < kHotSpell) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(200));
    }
  }
}

bool ParameterStore::Impl::awaits_registration(const std::vector<std::byte>& message) const {
  RequestHeader req{};
  if (message.size() < sizeof req) return false;  // answer() refuses it
  std::memcpy(&req, message.data(), sizeof req);
  if (message.size() < sizeof req + std::size_t{req.entries} * sizeof(RequestEntry)) return false;
  std::uint32_t newest = 0;
  for (std::uint32_t i = 0; i < req.entries; ++i) {
    RequestEntry e{};
    std::memcpy(&e, message.data() + sizeof req + i * sizeof e, sizeof e);
    newest = std::max(newest, e.tensor);
  }
  std::lock_guard<std::mutex> lock(tensors_mu);
  return req.entries > 0 && newest >= tensors.size();
}

void ParameterStore::Impl::answer_deferred(
    std::vector<std::pair<int, std::vector<std::byte>>>& deferred) {
  auto ready = std::stable_partition(deferred.begin(), deferred.end(), [&](const auto& d) {
    return awaits_registration(d.second);
  });
  for (auto it = ready; it != deferred.end(); ++it) answer(it->first, it->second);
  deferred.erase(ready, deferred.end());
}

void ParameterStore::Impl::answer(int source, const std::vector<std::byte>& message) {
  ++served;
  RequestHeader req{};
  std::vector<std::byte> reply;  // ReplyHeader, EntryReply x entries | error text
  std::vector<std::byte> values;  // a pull's data message
  int reply_tag = -1;
  try {
    if (message.size() < sizeof req) {
      throw InvalidArgument(fmt::format("a request of {} bytes", message.size()));
    }
    std::memcpy(&req, message.data(), sizeof req);
    reply_tag = req.reply_tag;
    if (req.kind != RequestKind::kPull && req.kind != RequestKind::kPush) {
      throw InvalidArgument(fmt::format("unknown request kind {}",
                                        static_cast<std::uint32_t>(req.kind)));
    }
    const std::size_t head = sizeof req + std::size_t{req.entries} * sizeof(RequestEntry);
    if (message.size() < head) {
      throw InvalidArgument(fmt::format("a request of {} entries in {} bytes", req.entries,
                                        message.size()));
    }
    // The whole request is checked before any of it is applied.
    std::vector<RequestEntry> entries(req.entries);
    std::vector<Shard*> shards;
    std::vector<std::shared_ptr<Tensor>> held;  // keeps the shards' tensors
    std::size_t value_bytes = 0;
    for (std::uint32_t i = 0; i < req.entries; ++i) {
      RequestEntry& e = entries[i];
      std::memcpy(&e, message.data() + sizeof req + i * sizeof e, sizeof e);
      auto t = tensor_by_id(e.tensor);
      if (!t || e.shard >= t->local.size() || !t->local[e.shard]) {
        throw InvalidArgument(fmt::format("tensor {} shard {} is not served by rank {}", e.tensor,
                                          e.shard, members[my_index]));
      }
      Shard& shard = *t->local[e.shard];
      if (req.kind == RequestKind::kPush) {
        try {
          shard.check_push(e.base, static_cast<PushPolicy>(e.policy));
        } catch (const InvalidArgument& x) {
          throw InvalidArgument(fmt::format("shard {} of '{}': {}", e.shard, t->name, x.what()));
        }
      }
      value_bytes += shard.nbytes();
      shards.push_back(&shard);
      held.push_back(std::move(t));
    }
    const std::size_t want = head + (req.kind == RequestKind::kPush ? value_bytes : 0);
    if (message.size() != want) {
      throw InvalidArgument(fmt::format("a request of {} bytes where its entries make {}",
                                        message.size(), want));
    }
    reply.resize(sizeof(ReplyHeader) + entries.size() * sizeof(EntryReply));
    const ReplyHeader h{ReplyStatus::kApplied, req.entries};
    std::memcpy(reply.data(), &h, sizeof h);
    if (req.kind == RequestKind::kPull) values.resize(value_bytes);
    std::size_t at = 0;  // into the deltas (push) or the values (pull)
    for (std::size_t i = 0; i < entries.size(); ++i) {
      Shard& shard = *shards[i];
      EntryReply r{};
      if (req.kind == RequestKind::kPull) {
        // The snapshot, with its version, straight into the data message.
        r.version = shard.read(values.data() + at);
        r.status = ReplyStatus::kApplied;
        r.factor = 1.0;
      } else {
        const PushOutcome o = shard.push(message.data() + head + at, entries[i].base,
                                         entries[i].staleness,
                                         static_cast<PushPolicy>(entries[i].policy));
        r.status = o.applied ? ReplyStatus::kApplied : ReplyStatus::kRejected;
        r.version = o.version;
        r.lag = o.lag;
        r.factor = o.factor;
      }
      at += shard.nbytes();
      std::memcpy(reply.data() + sizeof h + i * sizeof r, &r, sizeof r);
    }
  } catch (const std::exception& e) {
    const ReplyHeader h{ReplyStatus::kError, 0};
    const std::string text = e.what();
    reply.assign(sizeof h + std::min(text.size(), kErrorTextMax), std::byte{0});
    std::memcpy(reply.data(), &h, sizeof h);
    std::memcpy(reply.data() + sizeof h, text.data(), reply.size() - sizeof h);
    values.clear();
  }
  if (reply_tag < kFirstReplyTag) return;  // nowhere to answer
  try {
    channel->send(source, reply_tag, std::move(reply), deadline());
    // The caller posted a receive for the values after the reply's, on the
    // same tag: MPI keeps the two in order.
    if (!values.empty()) channel->send(source, reply_tag, std::move(values), deadline());
  } catch (const std::exception& e) {
    log.warn("parameter store: the reply to rank {} was not taken: {}", members[source],
             e.what());
  }
}

}  // namespace gyre
