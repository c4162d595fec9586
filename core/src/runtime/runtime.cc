#include "runtime/runtime.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <iterator>
#include <cstring>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/collectives/algorithms.h"
#include "gyre/collectives/cores.h"
#include "gyre/collectives/reduce_kernels.h"
#include "gyre/error.h"
#include "negotiation/message_tags.h"
#include "runtime/options_table.h"

namespace gyre::core {

namespace {

// Longest nap of the background thread's waits (GYRE_SPIN_WAIT_US).
constexpr std::chrono::microseconds kMaxNap{200};
// Least deadline of the first round (see loop()).
constexpr double kStartupTimeoutS = 60.0;
// After its deadline expired, how long a rank waits before aborting the job
// (at most a quarter of the deadline): see fatal().
constexpr double kAbortGraceS = 1.0;
// Longest reason of a local start-up failure carried by the agreement.
constexpr std::size_t kStartReasonBytes = 1024;

ErrorKind error_kind_of(const Error& e) {
  if (dynamic_cast<const InvalidArgument*>(&e)) return ErrorKind::kInvalidArgument;
  if (dynamic_cast<const MismatchError*>(&e)) return ErrorKind::kMismatch;
  if (dynamic_cast<const DivergenceError*>(&e)) return ErrorKind::kDivergence;
  if (dynamic_cast<const TimeoutError*>(&e)) return ErrorKind::kTimeout;
  if (dynamic_cast<const TransportError*>(&e)) return ErrorKind::kTransport;
  return ErrorKind::kState;
}

}  // namespace

std::chrono::milliseconds startup_deadline(const Options& opt) {
  if (opt.op_timeout_s == 0) return std::chrono::milliseconds(0);
  // NaN, negative or huge (Options set in code): the least.
  const double s = std::isfinite(opt.op_timeout_s) && opt.op_timeout_s > 0
                       ? std::clamp(opt.op_timeout_s, kStartupTimeoutS, 1e7)
                       : kStartupTimeoutS;
  return std::chrono::milliseconds(static_cast<long>(s * 1000.0));
}

namespace {

// The largest input the round speculates on over shared memory. In rank
// order (3 or more ranks): the shared-memory allreduce gives each rank a
// share of whole 64-byte lines, so up to one line rank 0 reduces it all,
// rank 0's operand first (above it rank 1's share would put rank 1's
// first: the same value, but not the same bits for min/max with NaN). At 2
// ranks any size would give the same bits, but above a line the
// shared-memory allreduce after the round costs less than carrying the
// input in the round's messages (2 ranks, 2 KiB: 5.1 against 6.0 us).
constexpr std::size_t kShmSpeculateBytes = 64;

NegotiatorOptions negotiator_options(const Options& o) {
  NegotiatorOptions n;
  n.cache_capacity = o.cache_capacity;
  n.log_depth = o.log_negotiation != 0;
  n.speculate_bytes = o.speculate_bytes;
  n.max_version_lag = o.max_version_lag;
  n.stall_shutdown_s = o.stall_shutdown_s;
  n.chunk_bytes = o.ring_chunk_bytes;
  n.tag = kTagNegotiate;
  return n;
}

}  // namespace

Runtime::Runtime(const Options& opt, std::unique_ptr<transport::Transport> t, RuntimeInfo info)
    : opt_(opt),
      t_(std::move(t)),
      data_t_(*t_),
      info_(std::move(info)),
      rank_(t_->rank()),
      size_(t_->size()),
      log_(rank_, opt.log_level),
      vv_(rank_, size_),
      negotiator_(*t_, negotiator_options(opt), vv_),
      stall_(rank_, opt.stall_warning_s, opt.stall_shutdown_s),
      timeline_(rank_, opt.timeline_max_bytes,
                [this](const std::string& why) { log_.warn("{}", why); }),
      backends_(data_t_, opt_, log_),
      executor_(data_t_, opt_, queue_, vv_, backends_, &timeline_, log_) {
  // Local set-up first; a failure here is told to every rank by the
  // agreement below instead of leaving them waiting for this rank.
  ErrorKind failure_kind = info_.start_failure_kind;
  std::string failure = info_.start_failure;
  if (failure_kind == ErrorKind::kNone && !opt_.timeline_path.empty()) {
    try {
      timeline_.start(opt_.timeline_path, false, "GYRE_TIMELINE");
    } catch (const Error& e) {
      failure_kind = error_kind_of(e);
      failure = e.what();
    }
  }
  agree_at_start(failure_kind, failure);
  if (info_.connect_host) info_.connect_host(info_);
  if (info_.cross) {
    // Across hosts of several ranks each: log-depth rounds in two tiers,
    // over the uncounted cross transport (the negotiator counts its own).
    if (info_.shm && opt_.log_negotiation != 0 && opt_.host_negotiation != 0) {
      negotiator_.set_host_tier(info_.shm->group(), *info_.cross);
    }
    cross_counted_ = std::make_shared<transport::CountingTransport>(info_.cross);
    info_.cross = cross_counted_;
  }
  if (info_.initial_step != 0) vv_.set_all(info_.initial_step);
  backends_.connect({info_.local_rank, info_.shm, info_.cross,
                     info_.local_size == 1 && info_.cross_size == size_ ? size_ : 0});
  // Small allreduces reduced within the log-depth round take their inputs
  // from the queue (Negotiator::set_speculation_source), where the round's
  // butterfly gives the bits the host backend's own allreduce would
  // (docs/architecture.md): recursive doubling over a power of two of ranks
  // at that size, on the flat transport or across hosts of one rank each, or
  // any backend at 2 ranks (both compute op(rank 0's, rank 1's)); over
  // shared memory at 3 or more ranks in rank order (every rank's input
  // gathered in the round, then reduced as the shared-memory allreduce
  // reduces an element: SpeculationOrder::kRankOrder; inputs of at most a
  // cache line, all in rank 0's share there; kShmSpeculateBytes). Across
  // hosts up to GYRE_SPECULATE_BYTES. Not across hosts of several
  // ranks. The order, which sizes the round's vector, is alike on every
  // rank; a rank whose own layout does not allow it leaves its speculation
  // void.
  const std::string backend = backends_.host_backend();
  const bool rank_order = backend == "shm" && size_ >= 3 && info_.process_set == 0;
  // Elsewhere the backend's allreduce is recursive doubling up to
  // GYRE_ALLREDUCE_SMALL_BYTES, or up to where its cost model gives a
  // smaller buffer to Rabenseifner's algorithm (cost_model.h).
  const std::size_t speculate_bytes =
      std::min(opt_.speculate_bytes,
               backend == "shm" ? kShmSpeculateBytes
                                : flat_recursive_doubling_bytes(backends_.host_layout_cost()));
  {
    const bool flat = backend == "cpu" || (backend == "hierarchical" && info_.local_size == 1);
    speculation_ = size_ >= 2 && speculate_bytes > 0 && opt_.log_negotiation != 0 &&
                   ((flat && std::has_single_bit(static_cast<unsigned>(size_))) ||
                    size_ == 2 ||
                    (rank_order && info_.shm && info_.shm->group().rank() == rank_));
  }
  negotiator_.set_speculation_source([this](const Request& r, std::span<std::byte> out) {
    if (!speculation_ || !queue_.copy_input(r, out)) return false;
    // Prescaled as the backends' allreduce scales each contribution.
    if (r.prescale != 1.0) {
      collectives::scale(out.data(), out.size() / dtype_size(r.dtype), r.dtype, r.prescale);
    }
    return true;
  }, rank_order ? SpeculationOrder::kRankOrder : SpeculationOrder::kPairs,
     speculate_bytes);
  // The background thread shares its rank's core with the training loop:
  // it spins briefly (negotiation and ring chunks normally arrive within
  // microseconds), then naps, so that a late peer costs no core time.
  t_->set_wait_policy({std::chrono::microseconds(static_cast<long>(opt_.spin_wait_us)),
                       kMaxNap});
  if (info_.p2p) info_.p2p->set_wake([this] { queue_.nudge(); });
  log_.debug("runtime started: {} ranks over {}, fusion threshold {} B, cycle {} ms", size_,
             t_->name(), opt_.fusion_threshold_bytes, opt_.cycle_time_ms);
  queue_.set_driver(callers_);
  thread_ = std::thread([this] { loop(); });
}

Runtime::~Runtime() { shutdown(); }

Runtime::NegotiationCounters Runtime::negotiation_counters() const {
  std::lock_guard<std::mutex> lock(counters_mu_);
  return counters_;
}

std::uint64_t Runtime::transport_messages() const {
  return negotiator_.messages_sent() + data_t_.messages() +
         (cross_counted_ ? cross_counted_->messages() : 0);
}

std::uint64_t Runtime::transport_bytes() const {
  return negotiator_.bytes_sent() + data_t_.bytes() +
         (cross_counted_ ? cross_counted_->bytes() : 0);
}

// GYRE_SPIN_WAIT_US, or none with more ranks on this host than cores: a
// polling rank would take the core of the peer it waits for.
std::chrono::microseconds Runtime::spin_time() const {
  if (collectives::oversubscribed(info_.local_size)) return std::chrono::microseconds(0);
  return std::chrono::microseconds(static_cast<long>(opt_.spin_wait_us));
}

// The start-up agreement. Each rank plans fusion buckets, ring chunks, the
// allreduce algorithm and cache slots, and judges version lag and stalls,
// from its own options; a difference would pair mismatched transfers or
// split the ranks' decisions. One allgather at start-up compares them (the
// options table says which), so a job with a GYRE_* variable set on some
// ranks only fails in init() on every rank, naming the variable. The same
// words carry every option, so a value out of range on one rank (Options set
// in code bypass the parser) fails every rank too, rather than that rank
// alone. They also carry each rank's local failure (its kind and reason, cut
// to kStartReasonBytes), so that a rank whose set-up failed takes part in
// the exchange and every rank throws its error with its rank number, at
// once, instead of the others waiting for it until the deadline. It is the
// first contact between the ranks: it waits as long as the first
// negotiation round would (see loop()).
void Runtime::agree_at_start(ErrorKind failure_kind, const std::string& failure) {
  const std::size_t k = option_word_count();
  const std::size_t reason_words = kStartReasonBytes / sizeof(std::uint64_t);
  const std::size_t per_rank = k + 2 + reason_words;
  std::vector<std::uint64_t> mine = option_words(opt_);
  mine.push_back(static_cast<std::uint64_t>(failure_kind));
  const std::size_t reason_len = std::min(failure.size(), kStartReasonBytes);
  mine.push_back(reason_len);
  mine.resize(per_rank, 0);
  std::memcpy(mine.data() + k + 2, failure.data(), reason_len);
  std::vector<std::uint64_t> all = mine;
  const auto n = static_cast<std::size_t>(size_);
  if (size_ > 1) {
    all.assign(per_rank * n, 0);
    // The options under test may differ or be out of range: the exchange
    // depends on none of them. One chunk carries the few words.
    collectives::AllgatherOptions ro;
    ro.chunk_bytes = 64 << 10;
    ro.tag = kTagNegotiate;
    if (opt_.op_timeout_s != 0) t_->set_timeout(startup_deadline(opt_));
    // Interruptible while it waits (Ctrl-C in Python), on this thread only.
    t_->set_interrupt_check(info_.interrupt_check);
    try {
      collectives::ring_allgather(*t_, mine.data(), all.data(),
                                  std::vector<std::size_t>(n, per_rank * sizeof(std::uint64_t)),
                                  ro);
    } catch (...) {
      t_->set_interrupt_check({});
      throw;
    }
    t_->set_interrupt_check({});
  }
  // Every rank reads the same words, so every rank throws the same error.
  std::vector<int> failed;
  std::vector<std::string> reasons;
  ErrorKind first_kind = ErrorKind::kNone;
  std::vector<std::uint64_t> options(k * n);
  for (std::size_t r = 0; r < n; ++r) {
    const std::uint64_t* w = all.data() + r * per_rank;
    std::copy(w, w + k, options.begin() + static_cast<std::ptrdiff_t>(r * k));
    const auto kind = w[k];
    if (kind == static_cast<std::uint64_t>(ErrorKind::kNone)) continue;
    const std::size_t len = std::min<std::uint64_t>(w[k + 1], kStartReasonBytes);
    std::string why(len, '\0');
    std::memcpy(why.data(), w + k + 2, len);
    if (failed.empty()) {
      first_kind = kind <= static_cast<std::uint64_t>(ErrorKind::kState)
                       ? static_cast<ErrorKind>(kind)
                       : ErrorKind::kState;
    }
    failed.push_back(static_cast<int>(r));
    reasons.push_back(std::move(why));
  }
  if (failed.size() == 1) {
    std::rethrow_exception(make_error(
        first_kind, fmt::format("gyre::init() failed on rank {}: {}", failed[0], reasons[0])));
  }
  if (!failed.empty()) {
    for (std::size_t i = 0; i < failed.size(); ++i) {
      reasons[i] = fmt::format("rank {}: {}", failed[i], reasons[i]);
    }
    std::rethrow_exception(make_error(
        first_kind, fmt::format("gyre::init() failed on ranks {}: {}", fmt::join(failed, ", "),
                                fmt::join(reasons, "; "))));
  }
  if (auto why = options_problems(options, size_)) throw InvalidArgument(*why);
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

void Runtime::check_cuda_tensor(const std::string& what, const char* which, const TensorView& t) {
  backends::check_cuda_tensor(what, which, t);
  const int bound = claim_cuda_device(t.device.index);
  if (bound != t.device.index) {
    throw InvalidArgument(fmt::format(
        "{}: {} is on cuda:{}, but this rank's CUDA tensors are on cuda:{} (gyre uses one GPU "
        "per rank)", what, which, t.device.index, bound));
  }
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
  // Outside mu_: no lock is taken while holding another.
  queue_.forget_latest();  // a join is another operation: see tensor_queue.h
  queue_.wake();
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
  {
    // A caller running a round holds the mutex: it finishes first.
    std::lock_guard<std::mutex> lock(callers_->mu);
    callers_->runtime = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(callers_->wake_mu);
    callers_->queue = nullptr;
  }
  fail_all(ErrorKind::kState,
           info_.process_set != 0
               ? fmt::format("process set {} was removed (remove_process_set) with this "
                             "operation pending", info_.process_set)
               : std::string("gyre was shut down with this operation pending"));
  log_.debug("runtime stopped after {} rounds ({} run by waiting callers)", rounds_.load(),
             caller_rounds_run_.load());
}

void Runtime::fail_all(ErrorKind kind, const std::string& why) {
  for (auto& e : queue_.close(why, kind)) {
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

void Runtime::fatal(const std::exception& e) {
  if (dynamic_cast<const RankFailedError*>(&e) != nullptr) {
    // A peer died and the MPI (ULFM) said so: the job goes on without it if
    // the survivors call gyre::rebuild(). Nothing is aborted; every pending
    // operation here fails with the one error class, as on every survivor.
    std::string text = fmt::format(
        "a rank failed during {}: {}. Call gyre::rebuild() on every surviving rank to go on "
        "without it (Python: gyre.torch.elastic.run does this; see docs/elastic.md)",
        phase(), e.what());
    log_.warn("{}", text);
    stopped_ = true;
    executor_.fail_held();
    fail_all(ErrorKind::kRankFailed, text);
    return;
  }
  const bool timeout = dynamic_cast<const TimeoutError*>(&e) != nullptr;
  std::string pending = fmt::format("{}", fmt::join(queue_.pending_names(), ", "));
  std::string text = fmt::format(
      "{} during {}: {}. Tensors pending on this rank: [{}]. {}", timeout ? "timed out" : "failed",
      phase(), e.what(), pending,
      timeout ? fmt::format("No progress for GYRE_OP_TIMEOUT_S={} s: a rank is stuck or gone "
                            "(each rank names the rank it waited for; those names lead back to "
                            "the stuck rank); aborting the job",
                            opt_.op_timeout_s)
              : std::string("The ranks can no longer agree: aborting the job"));
  log_.error("{}", text);
  stopped_ = true;
  if (timeout && info_.abort) {
    // The peers waiting in the same round reach their deadlines at about
    // the same moment. Aborting at once would let the launcher kill them
    // before they log whom they waited for, and the stuck rank is found by
    // following those lines (see above), so each gets a short grace first.
    std::this_thread::sleep_for(std::chrono::milliseconds(
        static_cast<long>(1000.0 * std::min(kAbortGraceS, opt_.op_timeout_s / 4))));
  }
  if (info_.abort) info_.abort(1);
  // abort returned (in-process tests): fail everything and stop.
  executor_.fail_held();
  fail_all(timeout ? ErrorKind::kTimeout : ErrorKind::kTransport, text);
}

std::string Runtime::phase() const {
  if (phase_.responses == 0) return fmt::format("negotiation round {}", phase_.round);
  return fmt::format("round {}: running {} responses from '{}'", phase_.round, phase_.responses,
                     phase_.first);
}

void Runtime::record_versions() {
  std::vector<std::uint64_t> v = vv_.snapshot();
  if (v == timeline_versions_) return;
  const std::vector<std::uint64_t> behind = steps_behind(v);
  std::vector<std::pair<std::string, double>> lags;
  for (std::size_t r = 0; r < behind.size(); ++r) {
    lags.emplace_back(fmt::format("rank {}", r), static_cast<double>(behind[r]));
  }
  timeline_.counter("VERSION_LAG", Clock::now(), lags);
  timeline_versions_ = std::move(v);
}

bool Runtime::round() {
  const std::uint64_t round_no = rounds_.load();
  if (timeline_.active()) timeline_.mark_cycle(Clock::now());
  phase_.round = round_no;
  phase_.responses = 0;
  RoundFlags flags;
  flags.shutdown = shutdown_requested_.load();
  flags.joined = join_requested_.load();
  flags.stall_failures.swap(stall_failures_);
  Agreement agreed = negotiator_.round(queue_.drain_new(), std::move(flags));
  rounds_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(counters_mu_);
    counters_.rounds = rounds_.load();
    counters_.requests_sent = negotiator_.requests_sent();
    counters_.cache_hits_sent = negotiator_.cache_hits_sent();
    counters_.log_depth_rounds = negotiator_.log_depth_rounds();
    counters_.speculated = negotiator_.speculated();
    counters_.messages = negotiator_.messages_sent();
  }
  if (timeline_.active()) record_versions();
  last_round_idle_ = agreed.idle && queue_.size() == 0;
  last_round_ran_ = !agreed.responses.empty();
  if (!agreed.responses.empty()) {
    phase_.responses = agreed.responses.size();
    phase_.first.assign(agreed.responses.front().name);
    if (log_.enabled(LogLevel::kTrace)) {
      std::vector<std::string> names;
      for (const auto& r : agreed.responses) names.push_back(r.name);
      log_.log(LogLevel::kTrace, "round {}: running [{}]", round_no, fmt::join(names, ", "));
    }
    executor_.run(agreed.responses, agreed.agreed_at,
                  agreed.speculated ? &*agreed.speculated : nullptr);
  }
  if (agreed.join_completed) {
    std::shared_ptr<OpState> join;
    {
      std::lock_guard<std::mutex> lock(mu_);
      join.swap(join_state_);
    }
    join_requested_ = false;
    if (join) {
      join->join_last_rank = *agreed.join_completed;
      join->complete_one();
    }
  }
  stall_failures_ = stall_.inspect(negotiator_.coordinator(), Clock::now(), log_);

  if (agreed.shutdown_rank >= 0) {
    std::string why;
    if (info_.process_set != 0) {
      why = fmt::format("process set {} was removed (remove_process_set, by its rank {}) with "
                        "this operation pending",
                        info_.process_set, agreed.shutdown_rank);
    } else if (agreed.shutdown_rank == rank_) {
      why = "gyre was shut down with this operation pending";
    } else {
      why = fmt::format("gyre was shut down by rank {} (its shutdown() stops every rank's "
                        "runtime in the same round)", agreed.shutdown_rank);
    }
    fail_all(ErrorKind::kState, why);
    if (info_.process_set == 0 && agreed.shutdown_rank != rank_ && info_.on_peer_shutdown) {
      info_.on_peer_shutdown();
    }
    return false;
  }
  return true;
}

}  // namespace gyre::core
