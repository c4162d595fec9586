#include "negotiation/coordinator.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "negotiation/version_vector.h"

namespace gyre::core {

bool Response::any_joined() const {
  return std::find(joined.begin(), joined.end(), true) != joined.end();
}

int Response::ranks_taking_part() const {
  return contributors + static_cast<int>(std::count(joined.begin(), joined.end(), true));
}

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

// The ranks that hold one value of a compared field.
struct ValueGroup {
  std::string value;
  std::vector<int> ranks;
};

// Compares one field across the submitting ranks. On disagreement returns
// "ranks disagree on <field>: rank 0 has X; ranks 1, 2 have Y".
std::optional<std::string> compare_field(
    const Response& resp, const char* field,
    const std::function<std::string(const Request&)>& value) {
  std::vector<ValueGroup> groups;
  for (std::size_t r = 0; r < resp.per_rank.size(); ++r) {
    if (!resp.per_rank[r]) continue;
    auto v = value(*resp.per_rank[r]);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const ValueGroup& g) { return g.value == v; });
    if (it == groups.end()) groups.push_back({v, {static_cast<int>(r)}});
    else it->ranks.push_back(static_cast<int>(r));
  }
  if (groups.size() <= 1) return std::nullopt;
  std::string parts;
  for (const auto& g : groups) {
    if (!parts.empty()) parts += "; ";
    parts += fmt::format("{} {} {}", rank_list(g.ranks), g.ranks.size() == 1 ? "has" : "have",
                         g.value);
  }
  return fmt::format("ranks disagree on {}: {}", field, parts);
}

// Whether every submitting rank sent the same request in every field that
// check() compares (scale factors bit for bit, the whole shape), and none
// failed: then no comparison can find a difference, and check() need not
// format each rank's values to compare them. Any difference takes the
// comparisons, which decide as before.
bool requests_alike(const Response& resp) {
  const Request* first = nullptr;
  for (const auto& q : resp.per_rank) {
    if (!q) continue;
    const Request& r = *q;
    if (r.error_kind != ErrorKind::kNone) return false;
    if (first == nullptr) {
      first = &r;
      continue;
    }
    if (r.seq != first->seq || r.collective != first->collective || r.group != first->group ||
        r.group_size != first->group_size || r.dtype != first->dtype ||
        r.device.type != first->device.type || r.op != first->op || r.root != first->root ||
        std::memcmp(&r.prescale, &first->prescale, sizeof(double)) != 0 ||
        std::memcmp(&r.postscale, &first->postscale, sizeof(double)) != 0 ||
        r.shape != first->shape || r.digests != first->digests ||
        r.resync_policy != first->resync_policy) {
      return false;
    }
  }
  return true;
}

// A grouped allreduce: its first member's name and its size.
struct GroupKey {
  std::string first;
  std::uint32_t size = 0;
  auto operator<=>(const GroupKey&) const = default;
};

// How many members of a group are ready, and the earliest arrival among them.
struct GroupProgress {
  std::uint32_t ready = 0;
  std::uint64_t first_arrival = 0;
};

// A ready tensor in the order responses are produced: by its group's first
// arrival (its own when not grouped), then its own arrival.
struct Scheduled {
  std::uint64_t group_arrival = 0;
  std::uint64_t arrival = 0;
  std::string name;
  bool operator<(const Scheduled& o) const {
    return std::tie(group_arrival, arrival) < std::tie(o.group_arrival, o.arrival);
  }
};

// How one rank grouped a tensor, as the "group" comparison quotes it.
std::string group_str(const Request& r) {
  return r.group_size ? fmt::format("group '{}' of {}", r.group, r.group_size)
                      : std::string("no group");
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

std::string trailing_dims(const Request& r) {
  if (r.shape.empty()) return "[] (a scalar; needs at least one dimension)";
  return fmt::format("[*, {}]", fmt::join(r.shape.begin() + 1, r.shape.end(), ", "));
}

// The groups of ready tensors whose submitting ranks grouped them
// differently, each with what differs ("for 'a', ranks disagree on group:
// rank 0 has group 'a' of 3; rank 1 has group 'a' of 2"); keyed by every
// group any rank put such a tensor in (no group is left out).
std::map<GroupKey, std::string> group_disagreements(
    const std::map<std::string, Coordinator::Pending>& pending,
    const std::vector<Scheduled>& ready) {
  std::map<GroupKey, std::string> out;
  for (const Scheduled& s : ready) {
    const Coordinator::Pending& p = pending.at(s.name);
    const Request* first = nullptr;
    bool differ = false;
    for (const auto& req : p.per_rank) {
      if (!req) continue;
      if (first == nullptr) first = &*req;
      else if (req->group != first->group || req->group_size != first->group_size) differ = true;
    }
    if (!differ) continue;
    Response view;
    view.per_rank = p.per_rank;
    const std::string why = fmt::format(
        "for '{}', {}", s.name,
        compare_field(view, "group", [](const Request& r) { return group_str(r); }).value_or(""));
    for (const auto& req : p.per_rank) {
      if (req && req->group_size >= 2) out.try_emplace(GroupKey{req->group, req->group_size}, why);
    }
  }
  return out;
}

}  // namespace

void Coordinator::add(int rank, Request r, Clock::time_point now) {
  auto [it, fresh] = pending_.try_emplace(r.name);
  Pending& p = it->second;
  if (fresh) {
    p.arrival = next_arrival_++;
    p.first_seen = now;
    p.per_rank.resize(static_cast<std::size_t>(size_));
  }
  auto& slot = p.per_rank[static_cast<std::size_t>(rank)];
  if (!slot) {
    slot = std::move(r);
    return;
  }
  // Made only when a rank's second request of the name comes before the
  // first is answered: a deque allocates when constructed, and every
  // operation of every round would pay for `size_` of them.
  if (p.later.empty()) p.later.resize(static_cast<std::size_t>(size_));
  p.later[static_cast<std::size_t>(rank)].push_back(std::move(r));
}

Response Coordinator::answer(std::map<std::string, Pending>::iterator it,
                             Clock::time_point now) {
  Pending& p = it->second;
  Response resp = make_response(it->first, p);
  bool more = false;
  p.per_rank.assign(static_cast<std::size_t>(size_), std::nullopt);
  for (std::size_t r = 0; r < p.later.size(); ++r) {
    if (p.later[r].empty()) continue;
    p.per_rank[r] = std::move(p.later[r].front());
    p.later[r].pop_front();
    more = true;
  }
  if (more) {
    // The later requests are a new arrival, after everything pending now.
    p.arrival = next_arrival_++;
    p.first_seen = now;
  } else {
    pending_.erase(it);
  }
  return resp;
}

Response Coordinator::make_response(const std::string& name, Pending& p) const {
  Response resp;
  resp.name = name;
  resp.per_rank = std::move(p.per_rank);
  resp.first_seen = p.first_seen;
  resp.joined.assign(static_cast<std::size_t>(size_), false);
  for (int r = 0; r < size_; ++r) {
    const auto& req = resp.per_rank[static_cast<std::size_t>(r)];
    if (req) {
      if (resp.contributors == 0) resp.agreed = *req;
      ++resp.contributors;
    } else if (joined_[static_cast<std::size_t>(r)]) {
      resp.joined[static_cast<std::size_t>(r)] = true;
    }
  }
  resp.collective = resp.agreed.collective;
  resp.agreed.error_kind = ErrorKind::kNone;
  resp.agreed.error.clear();
  check(resp);
  return resp;
}

void Coordinator::check(Response& resp) const {
  // Named only where a check fails: this runs for every response.
  auto what = [&] {
    return std::string(collective_name(resp.collective)) + " '" + resp.name + "'";
  };
  auto fail = [&](ErrorKind kind, const std::string& text) {
    resp.error_kind = kind;
    resp.error = fmt::format("{}: {}", what(), text);
  };
  // Usually every rank sent the same request: nothing below can differ.
  const bool alike = requests_alike(resp);
  // Requests of different iterations of a reused name: whatever else they
  // say, pairing them would combine data of different steps.
  if (auto diff = alike ? std::nullopt
                        : compare_field(resp, "the iteration of this name (how many times each "
                                              "rank submitted it)",
                                        [](const Request& r) { return fmt::format("{}", r.seq); })) {
    fail(ErrorKind::kMismatch, *diff);
    return;
  }
  // A rank that failed the operation on its own: everyone fails it with
  // that rank's reason.
  for (std::size_t r = 0; r < resp.per_rank.size(); ++r) {
    const auto& req = resp.per_rank[r];
    if (req && req->error_kind != ErrorKind::kNone) {
      fail(req->error_kind, fmt::format("failed on rank {}: {}", r, req->error));
      return;
    }
  }
  auto field = [&](const char* name, const std::function<std::string(const Request&)>& value) {
    if (alike || resp.error_kind != ErrorKind::kNone) return;
    if (auto diff = compare_field(resp, name, value)) fail(ErrorKind::kMismatch, *diff);
  };
  field("collective", [](const Request& r) { return std::string(collective_name(r.collective)); });
  field("group", group_str);
  if (!resp.ok()) return;
  const Collective c = resp.collective;
  const bool reduces = c == Collective::kAllreduce || c == Collective::kReducescatter;
  if (c != Collective::kBarrier && c != Collective::kFingerprint && c != Collective::kResync) {
    field("dtype", [](const Request& r) { return std::string(dtype_name(r.dtype)); });
    // The device type only: ranks may use different GPU indices.
    field("device", [](const Request& r) { return std::string(device_name(r.device.type)); });
  }
  if (reduces) {
    field("reduce op", [](const Request& r) { return std::string(op_name(r.op)); });
    field("prescale", [](const Request& r) { return fmt::format("{}", r.prescale); });
    field("postscale", [](const Request& r) { return fmt::format("{}", r.postscale); });
  }
  if (c == Collective::kBroadcast) {
    field("root", [](const Request& r) { return fmt::format("{}", r.root); });
  }
  if (reduces || c == Collective::kBroadcast) {
    field("shape", [](const Request& r) { return shape_str(r.shape); });
  }
  if (c == Collective::kAllgather || c == Collective::kAlltoall) {
    field("shape beyond the first dimension", trailing_dims);
  }
  if (c == Collective::kFingerprint) {
    field("buffer names", [](const Request& r) {
      return fmt::format("{} buffers (names hash {:016x})", r.digests.size() - 1, r.digests[0]);
    });
  }
  if (c == Collective::kResync) {
    field("policy", [](const Request& r) {
      return r.resync_policy == ResyncPolicy::kNewest ? "newest" : "average";
    });
    field("buffers", [](const Request& r) {
      return fmt::format("names, dtypes and shapes hash {:016x}", r.digests[0]);
    });
  }
  if (!resp.ok()) return;

  // Version vectors: the steps carried by the requests of this tensor.
  // Usually all equal, which no lag limit refuses.
  std::optional<std::uint64_t> first_step;
  bool steps_differ = false;
  for (const auto& req : resp.per_rank) {
    if (!req) continue;
    if (!first_step) first_step = req->step;
    else steps_differ = steps_differ || req->step != *first_step;
  }
  // Only tensors of training steps are compared: fingerprint_check and
  // resync are how diverged ranks are examined and repaired, and a barrier
  // carries no data.
  if (steps_differ && c != Collective::kResync && c != Collective::kFingerprint &&
      c != Collective::kBarrier) {
    std::vector<std::optional<std::uint64_t>> steps(resp.per_rank.size());
    for (std::size_t r = 0; r < resp.per_rank.size(); ++r) {
      if (resp.per_rank[r]) steps[r] = resp.per_rank[r]->step;
    }
    if (auto text = check_lag(what(), steps, max_lag_)) {
      resp.error_kind = ErrorKind::kDivergence;
      resp.error = *text;
      return;
    }
  }

  if (resp.any_joined()) {
    std::vector<int> joined;
    for (std::size_t r = 0; r < resp.joined.size(); ++r) {
      if (resp.joined[r]) joined.push_back(static_cast<int>(r));
    }
    // Adasum as Horovod's join defines it: a joined rank's zeros leave its
    // partner's vector unchanged (the pairwise rule takes a zero vector's
    // coefficient as 1, without dividing by its norm).
    // Horovod's join: allgather and broadcast (and every other collective
    // a zero contribution cannot stand in for) fail on the ranks still
    // running, which go on in step with the joined ones.
    bool supported = c == Collective::kBarrier ||
                     (reduces && (resp.agreed.op == ReduceOp::kSum ||
                                  resp.agreed.op == ReduceOp::kAverage)) ||
                     (c == Collective::kAllreduce && resp.agreed.op == ReduceOp::kAdasum);
    if (!supported) {
      fail(ErrorKind::kState,
           fmt::format("{} joined and cannot take part (while a rank has joined, only sum, "
                       "average and Adasum allreduces and sum and average reduce-scatters run, "
                       "the joined ranks contributing zeros)",
                       rank_list(joined)));
    }
  }
}

RoundOutcome Coordinator::process(const std::vector<RoundMessage>& msgs, ResponseCache& cache,
                                  Clock::time_point now) {
  if (msgs.size() != static_cast<std::size_t>(size_)) {
    throw std::logic_error(fmt::format("Coordinator::process: {} messages for {} ranks",
                                       msgs.size(), size_));
  }
  return process_messages([&](int r) -> const RoundMessage& {
    return msgs[static_cast<std::size_t>(r)];
  }, cache, now);
}

RoundOutcome Coordinator::process_alike(const RoundMessage& each, ResponseCache& cache,
                                        Clock::time_point now) {
  return process_messages([&](int) -> const RoundMessage& { return each; }, cache, now);
}

RoundOutcome Coordinator::process_messages(
    const std::function<const RoundMessage&(int)>& message_of, ResponseCache& cache,
    Clock::time_point now) {
  RoundOutcome out;
  // 1. Flags and submissions, in rank order, with the cache as it was at
  //    the start of the round.
  for (int r = 0; r < size_; ++r) {
    const RoundMessage& m = message_of(r);
    if (m.shutdown && out.shutdown_rank < 0) out.shutdown_rank = r;
    if (m.joined && !joined_[static_cast<std::size_t>(r)]) {
      joined_[static_cast<std::size_t>(r)] = true;
      join_order_.push_back(r);
    }
    for (auto slot : m.cache_hits) {
      Request req;
      try {
        req = cache.hit(slot);
      } catch (const TransportError& e) {
        throw TransportError(fmt::format("negotiation message from rank {}: {}", r, e.what()));
      }
      req.step = m.step;
      add(r, std::move(req), now);
    }
    for (const auto& req : m.requests) add(r, req, now);
  }

  // 2. Tensors the stall inspector of rank 0 gave up on.
  for (int from = 0; from < size_; ++from) {
    for (const auto& name : message_of(from).stall_failures) {
      auto it = pending_.find(name);
      if (it == pending_.end()) continue;
      std::vector<int> missing, present;
      for (int r = 0; r < size_; ++r) {
        if (it->second.per_rank[static_cast<std::size_t>(r)]) present.push_back(r);
        else if (!joined_[static_cast<std::size_t>(r)]) missing.push_back(r);
      }
      // The last ranks' requests came in this very round (step 1), after
      // rank 0 decided: the operation is no longer stalled and runs.
      if (missing.empty()) continue;
      Response resp = answer(it, now);
      resp.error_kind = ErrorKind::kTimeout;
      resp.error = fmt::format(
          "{} '{}': stalled past its timeout (the process group's, or GYRE_STALL_SHUTDOWN_S "
          "= {} s): {} never enqueued it ({} did)",
          collective_name(resp.collective), name, stall_shutdown_s_, rank_list(missing),
          rank_list(present));
      out.responses.push_back(std::move(resp));
    }
  }

  // 3. Ready tensors, in order of first arrival.
  std::vector<Scheduled> ready;
  for (const auto& [name, p] : pending_) {
    bool all = true;
    for (int r = 0; r < size_ && all; ++r) {
      all = p.per_rank[static_cast<std::size_t>(r)] || joined_[static_cast<std::size_t>(r)];
    }
    if (all) ready.push_back({p.arrival, p.arrival, name});
  }
  // Members of a grouped allreduce wait until the whole group is ready and
  // then run together, ordered by the group's first arrival.
  auto group_of = [&](const std::string& name) -> GroupKey {
    for (const auto& req : pending_.at(name).per_rank) {
      if (req) return {req->group, req->group_size};
    }
    return {};
  };
  // A ready tensor its ranks grouped differently (another size or first
  // name, or grouped on some ranks only) can never complete the group as
  // any one rank sees it: every group any rank put it in fails now, its
  // members not ready included, so no rank waits for members that the
  // others never send.
  const std::map<GroupKey, std::string> failed_groups = group_disagreements(pending_, ready);
  auto in_failed_group = [&](const Pending& p) -> const std::string* {
    for (const auto& req : p.per_rank) {
      if (!req) continue;
      auto it = failed_groups.find(GroupKey{req->group, req->group_size});
      if (it != failed_groups.end()) return &it->second;
    }
    return nullptr;
  };
  std::map<std::string, const std::string*> group_failure;  // name -> what differs
  if (!failed_groups.empty()) {
    for (const auto& [name, p] : pending_) {
      if (const std::string* why = in_failed_group(p)) group_failure.emplace(name, why);
    }
  }
  std::map<GroupKey, GroupProgress> groups;
  for (const Scheduled& s : ready) {
    GroupKey g = group_of(s.name);
    if (g.size < 2 || group_failure.count(s.name)) continue;
    GroupProgress& progress = groups.try_emplace(g, GroupProgress{0, s.arrival}).first->second;
    ++progress.ready;
    progress.first_arrival = std::min(progress.first_arrival, s.arrival);
  }
  std::vector<Scheduled> order;
  for (Scheduled& s : ready) {
    GroupKey g = group_of(s.name);
    if (g.size < 2 || group_failure.count(s.name)) {
      order.push_back(std::move(s));
    } else if (const GroupProgress& progress = groups[g]; progress.ready >= g.size) {
      s.group_arrival = progress.first_arrival;
      order.push_back(std::move(s));
    }
  }
  for (const auto& [name, why] : group_failure) {
    const Pending& p = pending_.at(name);
    bool is_ready = true;
    for (int r = 0; r < size_ && is_ready; ++r) {
      is_ready = p.per_rank[static_cast<std::size_t>(r)] || joined_[static_cast<std::size_t>(r)];
    }
    if (!is_ready) order.push_back({p.arrival, p.arrival, name});
  }
  std::sort(order.begin(), order.end());
  for (const Scheduled& s : order) {
    auto it = pending_.find(s.name);
    Response resp = answer(it, now);
    if (auto g = group_failure.find(s.name); g != group_failure.end() && resp.ok()) {
      resp.error_kind = ErrorKind::kMismatch;
      resp.error = fmt::format("{} '{}': its grouped allreduce failed: {}",
                               collective_name(resp.collective), s.name, *g->second);
    }
    // Fingerprints and resyncs carry digests that differ every call.
    if (resp.ok() && resp.collective != Collective::kFingerprint &&
        resp.collective != Collective::kResync) {
      cache.put(resp.agreed);
    }
    out.responses.push_back(std::move(resp));
  }

  // 4. Join completes once every rank has joined.
  if (std::all_of(joined_.begin(), joined_.end(), [](bool j) { return j; })) {
    out.join_completed = join_order_.back();
    std::fill(joined_.begin(), joined_.end(), false);
    join_order_.clear();
  }
  return out;
}

}  // namespace gyre::core
