// ShmGroup: the layout of a shared region (counters, then slots) and the
// counter barrier.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <ctime>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gyre/collectives/cores.h"
#include "gyre/collectives/shm.h"
#include "gyre/error.h"

namespace gyre::collectives {

namespace {
constexpr std::size_t kLine = 64;
std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
// futex(2) on a word of memory the ranks share (not FUTEX_PRIVATE: the
// waiters are other processes). `limit` zero: no limit.
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t seen,
                std::chrono::nanoseconds limit) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(limit.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(limit.count() % 1000000000);
  // EAGAIN (the word moved), EINTR and ETIMEDOUT all send the caller back
  // to look at the counters, which is all a wake-up means.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, seen,
          limit.count() > 0 ? &ts : nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<std::uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr,
          nullptr, 0);
}
}  // namespace

// Each counter on a cache line of its own: a rank's release store must not
// invalidate the line its peers are polling for another rank.
struct ShmGroup::Header {
  struct alignas(kLine) Counter {
    std::atomic<std::uint64_t> value;
  };
  Counter arrived[kShmMaxRanks];  // barriers passed by each rank
  Counter failed;                 // nonzero: 1 + the rank that failed
  // Set before `failed` by a rank whose barrier timed out: bit r for each
  // rank that had not arrived, so that every peer can name the rank they
  // all waited for rather than the one that gave up first.
  Counter late;
  // Sleeping waiters: a rank that stops polling counts itself in
  // `sleepers`, reads `wake` and sleeps on it (futex) unless its peer has
  // arrived meanwhile; a rank that arrives or fails and sees a sleeper
  // bumps `wake` and wakes them all. Both sides use sequentially consistent
  // operations, so either the arriving rank sees the sleeper or the sleeper
  // sees the arrival: no wake-up is lost, and without sleepers an arrival
  // costs one load and no system call.
  Counter sleepers;
  struct alignas(kLine) Word {
    std::atomic<std::uint32_t> value;
  };
  Word wake;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "counters in shared memory need lock-free 64-bit atomics");
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "the futex word must be a plain 32-bit word");

std::size_t ShmGroup::region_bytes(int size, std::size_t slot_bytes) {
  return round_up(sizeof(Header), kLine) +
         static_cast<std::size_t>(size) * round_up(slot_bytes, kLine);
}

ShmGroup::ShmGroup(void* region, int rank, int size, const ShmOptions& opt)
    : header_(static_cast<Header*>(region)),
      slots_(static_cast<std::byte*>(region) + round_up(sizeof(Header), kLine)),
      rank_(rank), size_(size), opt_(opt) {
  if (size < 1 || size > kShmMaxRanks || rank < 0 || rank >= size) {
    throw InvalidArgument(fmt::format("shared memory group: rank {} of {} (at most {} ranks)",
                                      rank, size, kShmMaxRanks));
  }
  if (opt.slot_bytes < kLine || reinterpret_cast<std::uintptr_t>(region) % kLine != 0) {
    throw InvalidArgument(fmt::format(
        "shared memory group: slot of {} bytes (at least {}) in a region at {} (64-byte aligned)",
        opt.slot_bytes, kLine, region));
  }
  opt_.slot_bytes = round_up(opt.slot_bytes, kLine);
  // With more ranks than cores the rank waited for is likely the one
  // descheduled, and polling takes the core it needs: sleep at once.
  if (oversubscribed(size)) opt_.spin = std::chrono::microseconds(0);
  epoch_ = header_->arrived[rank].value.load(std::memory_order_acquire);
}

std::byte* ShmGroup::slot(int r) const {
  return slots_ + static_cast<std::size_t>(r) * opt_.slot_bytes;
}

void ShmGroup::wake_sleepers() noexcept {
  if (header_->sleepers.value.load(std::memory_order_seq_cst) == 0) return;
  header_->wake.value.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&header_->wake.value);
}

void ShmGroup::sleep_until_arrived(int q, std::chrono::nanoseconds limit) {
  header_->sleepers.value.fetch_add(1, std::memory_order_seq_cst);
  const std::uint32_t seen = header_->wake.value.load(std::memory_order_seq_cst);
  if (header_->arrived[q].value.load(std::memory_order_seq_cst) < epoch_ &&
      header_->failed.value.load(std::memory_order_seq_cst) == 0) {
    futex_wait(&header_->wake.value, seen, limit);
  }
  header_->sleepers.value.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmGroup::fail() noexcept {
  std::uint64_t none = 0;
  header_->failed.value.compare_exchange_strong(none, static_cast<std::uint64_t>(rank_) + 1,
                                                std::memory_order_seq_cst);
  wake_sleepers();
}

bool ShmGroup::failed() const noexcept {
  return header_->failed.value.load(std::memory_order_acquire) != 0;
}

void ShmGroup::barrier() {
  ++epoch_;
  header_->arrived[rank_].value.store(epoch_, std::memory_order_seq_cst);
  wake_sleepers();
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (int q = 0; q < size_;) {
    if (header_->arrived[q].value.load(std::memory_order_acquire) >= epoch_) {
      ++q;
      continue;
    }
    if (auto f = header_->failed.value.load(std::memory_order_acquire)) {
      if (auto late = header_->late.value.load(std::memory_order_acquire)) {
        std::vector<int> ranks;
        for (int r = 0; r < size_; ++r) {
          if (late & (std::uint64_t{1} << r)) ranks.push_back(r);
        }
        throw TimeoutError(fmt::format(
            "shared memory group: local rank {} waited {} ms for local rank(s) {} to reach "
            "barrier {} and gave up; rank {} stops waiting",
            f - 1, opt_.timeout.count(), fmt::join(ranks, ", "), epoch_, rank_));
      }
      throw TransportError(fmt::format(
          "shared memory group: local rank {} failed inside a collective; rank {} stops waiting",
          f - 1, rank_));
    }
    const auto waited = Clock::now() - start;
    if (opt_.timeout.count() > 0 && waited > opt_.timeout) {
      std::vector<int> late;
      std::uint64_t mask = 0;
      for (int r = 0; r < size_; ++r) {
        if (header_->arrived[r].value.load(std::memory_order_acquire) < epoch_) {
          late.push_back(r);
          mask |= std::uint64_t{1} << r;
        }
      }
      // Every rank arrived after all: this rank was itself stopped or
      // descheduled past the deadline, and the barrier is complete.
      if (mask == 0) continue;
      std::uint64_t none = 0;  // the first rank to time out names the late ones
      header_->late.value.compare_exchange_strong(none, mask, std::memory_order_acq_rel);
      fail();
      throw TimeoutError(fmt::format(
          "shared memory group: rank {} waited {} ms for local rank(s) {} to reach barrier {}",
          rank_, opt_.timeout.count(), fmt::join(late, ", "), epoch_));
    }
    if (waited >= opt_.spin) {
      // Until an arrival or a failure wakes it, or the deadline (none: no
      // limit, as the polling wait had none).
      std::chrono::nanoseconds limit{0};
      if (opt_.timeout.count() > 0) {
        limit = std::chrono::nanoseconds(opt_.timeout - waited) + std::chrono::microseconds(1);
      }
      sleep_until_arrived(q, limit);
    }
  }
}

}  // namespace gyre::collectives
