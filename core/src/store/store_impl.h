// The parameter store's internals shared by its sides: the wire protocol
// and ParameterStore::Impl, whose lifecycle and registration are in
// parameter_store.cc, whose client side (pull and push: the requests a
// member sends for shards other members own) is in store_client.cc and
// whose server side (the thread that answers the requests for this
// member's shards) is in store_server.cc.
//
// Wire protocol, on the store's own communicator (MpiStoreChannel): a call
// (pull or push of one tensor or several) sends one request to each owner
// of some of its shards, for all of that owner's shards at once.
//   request (tag kRequestTag)  RequestHeader, RequestEntry x entries
//                              [+ push: the entries' delta bytes, in order]
//   reply   (tag: the request's reply_tag)
//                              ReplyHeader, EntryReply x entries
//                              | ReplyHeader (status kError), an error message
//   data    (the same tag, after the reply; a pull answered without error,
//            of a nonempty total): the entries' shard bytes, in order
// A request is checked whole before any of it is applied: a refusal changes
// nothing. MPI keeps the messages of one sender and tag in order: the
// caller posts the reply's receive, then the data's (straight into its
// outputs, one copy from the owner's snapshot to them), then sends the
// request. Each call has reply tags of its own, so concurrent calls from
// several threads never take each other's replies, and a reply never waits
// for its receiver.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gyre/collectives/mpi_store_channel.h"
#include "gyre/store.h"
#include "runtime/logging.h"
#include "store/placement.h"
#include "store/shard.h"
#include "store/store_totals.h"

namespace gyre {

namespace core::store {

inline constexpr int kRequestTag = 1;
inline constexpr int kFirstReplyTag = 2;
inline constexpr int kReplyTags = 30000;  // MPI guarantees tags up to 32767
inline constexpr int kChannelTagBase = 0x5710;

enum class RequestKind : std::uint32_t { kPull = 1, kPush = 2 };
enum class ReplyStatus : std::int32_t { kApplied = 0, kRejected = 1, kError = 2 };

struct RequestHeader {
  RequestKind kind;
  std::uint32_t entries;
  std::int32_t reply_tag;
  std::uint32_t reserved;
};

// One shard of a request. base, staleness and policy: pushes only.
struct RequestEntry {
  std::uint32_t tensor;
  std::uint32_t shard;
  std::int64_t base;
  std::int64_t staleness;
  std::uint32_t policy;
  std::uint32_t reserved;
};

struct ReplyHeader {
  ReplyStatus status;  // kError: the whole request was refused (text follows)
  std::uint32_t entries;
};

struct EntryReply {
  ReplyStatus status;  // kApplied (a pull: read) or kRejected
  std::int32_t reserved;
  std::int64_t version;
  std::int64_t lag;
  double factor;
};

inline constexpr std::size_t kErrorTextMax = 2048;

template <typename T>
std::span<const std::byte> bytes_of(const T& v) {
  return {reinterpret_cast<const std::byte*>(&v), sizeof(T)};
}

}  // namespace core::store

struct ParameterStore::Impl {
  using Clock = std::chrono::steady_clock;
  using MpiStoreChannel = transport::MpiStoreChannel;
  using PushOutcome = core::store::PushOutcome;
  using Shard = core::store::Shard;
  using ShardSpan = core::store::ShardSpan;

  struct Tensor {
    std::uint32_t id = 0;
    std::string name;
    DataType dtype = DataType::kFloat32;
    std::int64_t numel = 0;
    std::vector<ShardSpan> shards;
    // This member's shards, by shard index (null where another owns it).
    std::vector<std::unique_ptr<Shard>> local;
  };

  int process_set = kGlobalProcessSet;
  int store_index = 0;  // agreed by the members at construction: the channel's tag, op names
  StoreOptions options;
  std::vector<int> members;  // world ranks, in the set's order
  int my_index = 0;
  double timeout_s = 0;
  core::Logger log;
  std::unique_ptr<MpiStoreChannel> channel;

  // Registration happens on one thread at a time (collective); lookups from
  // any thread.
  mutable std::mutex tensors_mu;  // guards tensors, by_name, bytes_held
  std::vector<std::shared_ptr<Tensor>> tensors;
  std::unordered_map<std::string, std::shared_ptr<Tensor>> by_name;
  std::vector<std::size_t> bytes_held;

  std::atomic<bool> open{true};
  bool closed = false;  // close() ran: every member is done with the communicator
  std::atomic<bool> stop_server{false};
  // Set by the server thread when it stopped on an error (under ULFM: a
  // member's death, RankFailedError): check_members() then throws it.
  // server_failure and server_failure_rank are written before the flag.
  std::atomic<bool> server_failed{false};
  std::string server_failure;
  bool server_failure_rank = false;
  std::thread server;
  // Held while the server thread is joined: a store is stopped from two
  // threads at once when a peer's shutdown reaches this rank's runtime
  // (stop_all_stores() on its background thread) while the owner closes or
  // destroys the store; joining one std::thread from two threads is
  // undefined (with glibc the second joiner was seen to wait forever).
  std::mutex server_join_mu;
  std::atomic<int> next_reply_tag{0};

  std::atomic<std::int64_t> pulls{0}, pushes{0}, applied{0}, rejected{0}, scaled{0}, served{0},
      max_lag{0};

  Clock::time_point deadline() const {
    if (timeout_s <= 0) return Clock::time_point::max();
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(timeout_s));
  }

  int reply_tag() {
    return core::store::kFirstReplyTag +
           next_reply_tag.fetch_add(1, std::memory_order_relaxed) % core::store::kReplyTags;
  }

  void check_open(const char* call) const {
    if (!open.load()) {
      throw StateError(fmt::format("ParameterStore::{}: the store is closed (close(), or gyre "
                                   "was shut down)", call));
    }
  }

  // Client calls (pull, push) in progress on any thread: stopping the
  // store waits until none is left in MPI (a call notices the store closing
  // within one poll of its waits), so that none calls MPI after gyre has
  // shut down and MPI is finalised.
  std::atomic<int> calls{0};
  // A call's span: counted before `open` is checked (stop_server clears
  // `open` before it reads the count, so one of the two sees the other).
  class CallScope {
   public:
    CallScope(Impl& impl, const char* call) : impl_(impl) {
      impl_.calls.fetch_add(1);
      try {
        impl_.check_open(call);
      } catch (...) {
        impl_.calls.fetch_sub(1);
        throw;
      }
    }
    ~CallScope() { impl_.calls.fetch_sub(1); }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    Impl& impl_;
  };

  std::shared_ptr<Tensor> find(const std::string& name, const char* call) const {
    std::lock_guard<std::mutex> lock(tensors_mu);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      throw InvalidArgument(fmt::format("ParameterStore::{}: no tensor '{}' is registered", call,
                                        name));
    }
    return it->second;
  }

  std::shared_ptr<Tensor> tensor_by_id(std::uint32_t id) const {
    std::lock_guard<std::mutex> lock(tensors_mu);
    if (id >= tensors.size()) return nullptr;
    return tensors[id];
  }

  void note_push(const PushOutcome& o) {
    core::store_totals().note(o.applied, o.applied && o.factor != 1.0, o.lag);
    ++pushes;
    if (o.applied) {
      ++applied;
      if (o.factor != 1.0) ++scaled;
    } else {
      ++rejected;
    }
    std::int64_t seen = max_lag.load();
    while (o.lag > seen && !max_lag.compare_exchange_weak(seen, o.lag)) {
    }
  }

  // --- the server (store_server.cc): answers requests for this member's
  // shards, on its own thread from construction to close() or destruction.

  void serve();
  bool awaits_registration(const std::vector<std::byte>& message) const;
  void answer_deferred(std::vector<std::pair<int, std::vector<std::byte>>>& deferred);
  void answer(int source, const std::vector<std::byte>& message);

  // --- the client (store_client.cc): one request per owner per call,
  // replies awaited together.

  // One shard of a call: the call's item it belongs to (an index into the
  // call's tensors), and where its bytes are in the caller's tensor.
  struct Part {
    std::size_t item = 0;
    const Tensor* tensor = nullptr;
    int shard = 0;
    std::byte* bytes = nullptr;  // pull: where its values go; push: its delta
    std::size_t nbytes = 0;
    std::int64_t base = 0;       // push: the version the delta was computed from
    std::int64_t staleness = -1;
    PushPolicy policy = PushPolicy::kReject;
  };

  // A call's request to one owner, for all the call's shards it holds.
  struct Outstanding {
    int owner = 0;  // member index
    std::vector<Part> parts;
    std::vector<std::byte> reply;
    std::unique_ptr<MpiStoreChannel::Receive> receive;  // the reply
    std::unique_ptr<MpiStoreChannel::Receive> data;     // a pull's values
  };

  // The call's text for errors: "pull('w')", "push('a', 'b')".
  struct CallName {
    const char* call;
    std::string names;
    bool several = false;  // several tensors: name the tensor of a shard
  };

  // Sends one request per member (other than this one) owning some of
  // `parts`, its replies posted first. Returns them, awaiting replies.
  std::vector<Outstanding> send_requests(const CallName& c, core::store::RequestKind kind,
                                         const std::vector<Part>& parts);
  // Waits for every reply; calls `take` for each part with its outcome;
  // throws the first failure, naming the owner and a shard (every receive
  // is cancelled by its destructor on the way out).
  void await(const CallName& c, std::vector<Outstanding>& out,
             const std::function<void(const Part&, const core::store::EntryReply&)>& take);

  // A request to `o`'s owner failed because a member died (ULFM): throws
  // RankFailedError naming the dead member(s), whichever member `o` was for.
  [[noreturn]] void throw_member_failed(const CallName& c, const Outstanding& o,
                                        const RankFailedError& e);
  // "rank 1 failed" for each member ULFM reports dead, waited for until
  // `limit` (this process may learn of the death after a revocation that
  // came from another member reached it: tens of ms here); empty if none.
  std::vector<std::string> dead_members(Clock::time_point limit) const;
  // "rank 1, owner of shard 0" (+ " of 'w'" when the call has several
  // tensors, + " and N more shards" when the request had several).
  std::string owner_text(const CallName& c, const Outstanding& o) const;
};

}  // namespace gyre
