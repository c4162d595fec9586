#include "runtime/runtime.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <iterator>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/collectives/algorithms.h"
#include "gyre/error.h"
#include "runtime/options_table.h"

namespace gyre::core {

namespace {

constexpr int kTagNegotiate = 1;
// Bytes of each rank's message that travel in the first allgather of a
// round; longer messages send the rest in a second one. Steady-state
// messages (flags, step, cache bits) fit easily.
constexpr std::size_t kInlineBytes = 256;
// Longest sleep between idle negotiation rounds (see loop()).
constexpr std::chrono::microseconds kIdleCycleMax{16000};
// Longest nap of the background thread's waits (GYRE_SPIN_WAIT_US).
constexpr std::chrono::microseconds kMaxNap{200};
// Least deadline of the first round (see loop()).
constexpr double kStartupTimeoutS = 60.0;

}  // namespace

Runtime::Runtime(const Options& opt, std::unique_ptr<transport::Transport> t, RuntimeInfo info)
    : opt_(opt),
      t_(std::move(t)),
      info_(std::move(info)),
      rank_(t_->rank()),
      size_(t_->size()),
      log_(rank_, opt.log_level),
      vv_(rank_, size_),
      cache_(opt.cache_capacity),
      coord_(size_, opt.max_version_lag, opt.stall_shutdown_s),
      stall_(rank_, opt.stall_warning_s, opt.stall_shutdown_s),
      timeline_(rank_),
      executor_(*t_, opt_, queue_, vv_, &timeline_, log_) {
  if (!opt_.timeline_path.empty()) timeline_.start(opt_.timeline_path, false, "GYRE_TIMELINE");
  executor_.set_local_rank(info_.local_rank);
  if (info_.shm) executor_.use_shared_memory(info_.shm);
  // The background thread shares its rank's core with the training loop:
  // it spins briefly (negotiation and ring chunks normally arrive within
  // microseconds), then naps, so that a late peer costs no core time.
  t_->set_wait_policy({std::chrono::microseconds(static_cast<long>(opt_.spin_wait_us)),
                       kMaxNap});
  check_options_agree();
  log_.debug("runtime started: {} ranks over {}, fusion threshold {} B, cycle {} ms", size_,
             t_->name(), opt_.fusion_threshold_bytes, opt_.cycle_time_ms);
  thread_ = std::thread([this] { loop(); });
}

Runtime::~Runtime() { shutdown(); }

// Each rank plans fusion buckets, ring chunks, the allreduce algorithm and
// cache slots, and judges version lag and stalls, from its own options; a
// difference would pair mismatched transfers or split the ranks' decisions.
// One allgather at start-up compares them (the options table says which),
// so a job with a GYRE_* variable set on some ranks only fails in init() on
// every rank, naming the variable. The same words carry every option, so a
// value out of range on one rank (Options set in code bypass the parser)
// fails every rank too, rather than that rank alone. It is also the first
// contact between the ranks: it waits as long as the first negotiation
// round would (see loop()).
void Runtime::check_options_agree() {
  const std::vector<std::uint64_t> mine = option_words(opt_);
  std::vector<std::uint64_t> all = mine;
  if (size_ > 1) {
    const std::size_t k = mine.size();
    const auto n = static_cast<std::size_t>(size_);
    all.assign(k * n, 0);
    // The options under test may differ or be out of range: the exchange
    // depends on none of them. One chunk carries the few words.
    collectives::AllgatherOptions ro;
    ro.chunk_bytes = 64 << 10;
    ro.tag = kTagNegotiate;
    if (opt_.op_timeout_s != 0) {  // 0: wait forever; NaN, negative or huge: the least
      const double s = std::isfinite(opt_.op_timeout_s) && opt_.op_timeout_s > 0
                           ? std::clamp(opt_.op_timeout_s, kStartupTimeoutS, 1e7)
                           : kStartupTimeoutS;
      t_->set_timeout(std::chrono::milliseconds(static_cast<long>(s * 1000.0)));
    }
    collectives::ring_allgather(*t_, mine.data(), all.data(),
                                std::vector<std::size_t>(n, k * sizeof(std::uint64_t)), ro);
  }
  if (auto why = options_problems(all, size_)) throw InvalidArgument(*why);
}

void Runtime::start_timeline(const std::string& path, bool mark_cycles) {
  if (stopped_.load()) throw StateError("start_timeline(): gyre's background loop has stopped");
  timeline_.start(path, mark_cycles, "start_timeline()");
}

void Runtime::stop_timeline() { timeline_.stop(); }

std::string Runtime::internal_name(const char* what) {
  return fmt::format("__gyre.{}.{}", what, internal_seq_.fetch_add(1));
}

int Runtime::claim_cuda_device(int index) {
  int expected = -1;
  if (cuda_device_.compare_exchange_strong(expected, index)) return index;
  return expected;
}

std::shared_ptr<OpState> Runtime::request_join() {
  std::shared_ptr<OpState> state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_.load()) throw StateError("join(): gyre's background loop has stopped");
    if (join_state_) throw InvalidArgument("join(): this rank is already joining");
    join_state_ = state = std::make_shared<OpState>();
    join_requested_ = true;
  }
  queue_.wake();  // outside mu_: no lock is taken while holding another
  return state;
}

void Runtime::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_done_) return;
    shutdown_done_ = true;
  }
  shutdown_requested_ = true;
  queue_.wake();
  if (thread_.joinable()) thread_.join();
  fail_all(ErrorKind::kState, "gyre was shut down with this operation pending");
  log_.debug("runtime stopped after {} rounds", rounds_.load());
}

void Runtime::fail_all(ErrorKind kind, const std::string& why) {
  for (auto& e : queue_.close(why)) {
    e.state->complete_one(make_error(kind, fmt::format("{} '{}': {}",
                                                       collective_name(e.request.collective),
                                                       e.request.name, why)));
  }
  std::shared_ptr<OpState> join;
  {
    std::lock_guard<std::mutex> lock(mu_);
    join.swap(join_state_);
  }
  if (join) join->complete_one(make_error(kind, fmt::format("join(): {}", why)));
}

void Runtime::loop() {
  // Floored (options_table.h): a cycle of 0 would run rounds back to back.
  const auto cycle = std::chrono::microseconds(
      static_cast<long>(std::max(opt_.cycle_time_ms, kMinCycleTimeMs) * 1000.0));
  auto deadline = [](double seconds) {
    return std::chrono::milliseconds(std::max<long>(1, static_cast<long>(seconds * 1000.0)));
  };
  // Idle rounds (nothing enqueued, pending or said by any rank) come
  // further apart, the sleep doubling from the cycle time up to
  // kIdleCycleMax: each round is an exchange with every rank, and a rank
  // waiting for a peer busy elsewhere contends with its own process's MPI
  // calls and computation. Latency does not suffer: an enqueue wakes its
  // rank at once, and a round can complete nothing before every rank has
  // enqueued the tensor anyway. A joined rank keeps the cycle time, since
  // the others' tensors wait for its rounds.
  auto idle_sleep = cycle;
  const auto idle_max = std::max(cycle, kIdleCycleMax);
  bool first = true;
  // The first round doubles as the start-up barrier: ranks may reach init()
  // seconds apart, so it gets at least kStartupTimeoutS; a rank whose init()
  // failed after creating its transport still ends the job then.
  if (opt_.op_timeout_s > 0) t_->set_timeout(deadline(std::max(opt_.op_timeout_s, kStartupTimeoutS)));
  try {
    while (true) {
      if (!first) {
        idle_sleep = last_round_idle_ ? std::min(2 * idle_sleep, idle_max) : cycle;
        queue_.wait_for_work(idle_sleep);
      }
      if (!round()) break;
      if (first) {
        first = false;
        if (opt_.op_timeout_s > 0) t_->set_timeout(deadline(opt_.op_timeout_s));
      }
    }
  } catch (const std::exception& e) {
    fatal(e);
  }
  stopped_ = true;
}

void Runtime::fatal(const std::exception& e) {
  const bool timeout = dynamic_cast<const TimeoutError*>(&e) != nullptr;
  std::string pending = fmt::format("{}", fmt::join(queue_.pending_names(), ", "));
  std::string text = fmt::format(
      "{} during {}: {}. Tensors pending on this rank: [{}]. {}", timeout ? "timed out" : "failed",
      phase_, e.what(), pending,
      timeout ? fmt::format("No progress for GYRE_OP_TIMEOUT_S={} s: a rank is stuck or gone "
                            "(ranks wait on their ring predecessor, so the stuck rank is the "
                            "one the other ranks' messages lead back to); aborting the job",
                            opt_.op_timeout_s)
              : std::string("The ranks can no longer agree: aborting the job"));
  log_.error("{}", text);
  stopped_ = true;
  if (info_.abort) info_.abort(1);
  // abort returned (in-process tests): fail everything and stop.
  fail_all(timeout ? ErrorKind::kTimeout : ErrorKind::kTransport, text);
}

bool Runtime::round() {
  const std::uint64_t round_no = rounds_.load();
  if (timeline_.active()) timeline_.mark_cycle(Clock::now());
  phase_ = fmt::format("negotiation round {}", round_no);
  RoundMessage mine;
  mine.shutdown = shutdown_requested_.load();
  mine.joined = join_requested_.load();
  mine.step = vv_.own();
  for (auto& r : queue_.drain_new()) {
    if (r.error_kind == ErrorKind::kNone && r.step == mine.step) {
      if (auto slot = cache_.find(r)) {
        mine.cache_hits.push_back(*slot);
        continue;
      }
    }
    mine.requests.push_back(std::move(r));
  }
  mine.stall_failures.swap(stall_failures_);

  std::vector<RoundMessage> msgs = exchange(mine);
  rounds_.fetch_add(1);
  last_round_idle_ = !mine.joined && queue_.size() == 0 &&
                     std::all_of(msgs.begin(), msgs.end(), [](const RoundMessage& m) {
                       return !m.shutdown && !m.joined && m.requests.empty() &&
                              m.cache_hits.empty() && m.stall_failures.empty();
                     });
  for (int r = 0; r < size_; ++r) vv_.update(r, msgs[static_cast<std::size_t>(r)].step);
  const auto agreed_at = Clock::now();
  RoundOutcome out = coord_.process(msgs, cache_, agreed_at);

  if (!out.responses.empty()) {
    phase_ = fmt::format("round {}: running {} responses from '{}'", round_no,
                         out.responses.size(), out.responses.front().name);
    if (log_.enabled(LogLevel::kTrace)) {
      std::vector<std::string> names;
      for (const auto& r : out.responses) names.push_back(r.name);
      log_.log(LogLevel::kTrace, "round {}: running [{}]", round_no, fmt::join(names, ", "));
    }
    executor_.run(out.responses, agreed_at);
  }
  if (out.join_completed) {
    std::shared_ptr<OpState> join;
    {
      std::lock_guard<std::mutex> lock(mu_);
      join.swap(join_state_);
    }
    join_requested_ = false;
    if (join) {
      join->join_last_rank = *out.join_completed;
      join->complete_one();
    }
  }
  stall_failures_ = stall_.inspect(coord_, Clock::now(), log_);

  if (out.shutdown_rank >= 0) {
    fail_all(ErrorKind::kState,
             out.shutdown_rank == rank_
                 ? std::string("gyre was shut down with this operation pending")
                 : fmt::format("gyre was shut down by rank {} (its shutdown() stops every "
                               "rank's runtime in the same round)",
                               out.shutdown_rank));
    return false;
  }
  return true;
}

std::vector<RoundMessage> Runtime::exchange(const RoundMessage& mine) {
  std::vector<std::byte> bytes = encode(mine);
  std::vector<RoundMessage> out(static_cast<std::size_t>(size_));
  if (size_ == 1) {
    out[0] = decode(bytes, 0);
    return out;
  }
  const std::size_t n = static_cast<std::size_t>(size_);
  collectives::AllgatherOptions ro;
  ro.chunk_bytes = opt_.ring_chunk_bytes;
  ro.tag = kTagNegotiate;

  // Round part 1: the first kInlineBytes of every message (with its length).
  std::vector<std::byte> block(kInlineBytes, std::byte{0});
  std::memcpy(block.data(), bytes.data(), std::min(kInlineBytes, bytes.size()));
  std::vector<std::byte> first(kInlineBytes * n);
  std::vector<std::size_t> sizes(n, kInlineBytes);
  collectives::ring_allgather(*t_, block.data(), first.data(), sizes, ro);

  std::vector<std::size_t> lens(n), extra(n);
  bool more = false;
  for (std::size_t r = 0; r < n; ++r) {
    lens[r] = encoded_length(std::span<const std::byte>(first.data() + r * kInlineBytes, 4));
    extra[r] = lens[r] > kInlineBytes ? lens[r] - kInlineBytes : 0;
    more = more || extra[r] > 0;
  }
  // Part 2, only when some message was longer: the remainders.
  std::vector<std::byte> rest;
  std::vector<std::size_t> rest_at(n, 0);
  if (more) {
    std::size_t total = 0;
    for (std::size_t r = 0; r < n; ++r) {
      rest_at[r] = total;
      total += extra[r];
    }
    rest.resize(total);
    const std::byte* tail = bytes.size() > kInlineBytes ? bytes.data() + kInlineBytes : nullptr;
    collectives::ring_allgather(*t_, tail, rest.data(), extra, ro);
  }
  for (std::size_t r = 0; r < n; ++r) {
    std::vector<std::byte> msg(lens[r]);
    std::memcpy(msg.data(), first.data() + r * kInlineBytes, std::min(kInlineBytes, lens[r]));
    if (extra[r]) std::memcpy(msg.data() + kInlineBytes, rest.data() + rest_at[r], extra[r]);
    out[r] = decode(msg, static_cast<int>(r));
  }
  return out;
}

}  // namespace gyre::core
