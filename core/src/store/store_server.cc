// The parameter store's server side: the thread of each store that answers
// the other members' pull and push requests for this member's shards (the
// protocol: store_impl.h).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "store/store_impl.h"

namespace gyre {

using core::store::bytes_of;
using core::store::kErrorTextMax;
using core::store::kFirstReplyTag;
using core::store::kRequestTag;
using core::store::ReplyStatus;
using core::store::RequestKind;

void ParameterStore::Impl::serve() {
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
  std::lock_guard<std::mutex> lock(tensors_mu);
  return req.tensor >= tensors.size();
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
  ReplyHeader reply{};
  std::vector<std::byte> payload;
  int reply_tag = -1;
  try {
    if (message.size() < sizeof(RequestHeader)) {
      throw InvalidArgument(fmt::format("a request of {} bytes", message.size()));
    }
    std::memcpy(&req, message.data(), sizeof req);
    reply_tag = req.reply_tag;
    auto t = tensor_by_id(req.tensor);
    if (!t || req.shard >= t->local.size() || !t->local[req.shard]) {
      throw InvalidArgument(fmt::format("tensor {} shard {} is not served by rank {}",
                                        req.tensor, req.shard, members[my_index]));
    }
    Shard& shard = *t->local[req.shard];
    if (req.kind == RequestKind::kPull) {
      payload.resize(shard.nbytes());
      reply.version = shard.read(payload.data());
      reply.status = ReplyStatus::kApplied;
    } else if (req.kind == RequestKind::kPush) {
      if (message.size() != sizeof(RequestHeader) + shard.nbytes()) {
        throw InvalidArgument(fmt::format("a push of {} bytes to a shard of {}",
                                          message.size() - sizeof(RequestHeader),
                                          shard.nbytes()));
      }
      const PushOutcome o = shard.push(message.data() + sizeof(RequestHeader), req.base,
                                       req.staleness, static_cast<PushPolicy>(req.policy));
      reply.status = o.applied ? ReplyStatus::kApplied : ReplyStatus::kRejected;
      reply.version = o.version;
      reply.lag = o.lag;
      reply.factor = o.factor;
    } else {
      throw InvalidArgument(fmt::format("unknown request kind {}",
                                        static_cast<std::uint32_t>(req.kind)));
    }
  } catch (const std::exception& e) {
    reply.status = ReplyStatus::kError;
    const std::string text = e.what();
    payload.assign(reinterpret_cast<const std::byte*>(text.data()),
                   reinterpret_cast<const std::byte*>(text.data()) +
                       std::min(text.size(), kErrorTextMax));
  }
  if (reply_tag < kFirstReplyTag) return;  // nowhere to answer
  const std::span<const std::byte> parts[] = {bytes_of(reply), payload};
  try {
    channel->send(source, reply_tag, parts, deadline());
  } catch (const std::exception& e) {
    log.warn("parameter store: the reply to rank {} was not taken: {}", members[source],
             e.what());
  }
}

}  // namespace gyre
