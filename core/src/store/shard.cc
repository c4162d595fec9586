// A parameter-store shard: versioned values and the push policies (shard.h).
#include "store/shard.h"

#include <cstring>

#include <fmt/format.h>

#include "gyre/collectives/reduce_kernels.h"
#include "gyre/error.h"

namespace gyre::core::store {

Shard::Shard(DataType dtype, std::int64_t count, const std::byte* initial)
    : dtype_(dtype), count_(count), values_(static_cast<std::size_t>(count) * dtype_size(dtype)) {
  if (!values_.empty()) std::memcpy(values_.data(), initial, values_.size());
}

std::int64_t Shard::read(std::byte* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!values_.empty()) std::memcpy(out, values_.data(), values_.size());
  return version_;
}

namespace {

void check_policy(DataType dtype, PushPolicy policy) {
  if (policy == PushPolicy::kScale && !scaling_defined(dtype)) {
    throw InvalidArgument(fmt::format("the 'scale' policy is not defined on {}", dtype_name(dtype)));
  }
}

void check_base(std::int64_t base, std::int64_t version) {
  if (base < 0 || base > version) {
    throw InvalidArgument(fmt::format(
        "base version {} was never this shard's (it is at version {})", base, version));
  }
}

}  // namespace

void Shard::check_push(std::int64_t base, PushPolicy policy) const {
  check_policy(dtype_, policy);
  std::lock_guard<std::mutex> lock(mu_);
  check_base(base, version_);
}

PushOutcome Shard::push(const std::byte* delta, std::int64_t base, std::int64_t staleness,
                        PushPolicy policy) {
  check_policy(dtype_, policy);
  std::vector<std::byte> scaled;  // kScale with a lag: delta / (1 + lag)
  std::lock_guard<std::mutex> lock(mu_);
  check_base(base, version_);
  PushOutcome out;
  out.lag = version_ - base;
  const bool within = staleness < 0 || out.lag <= staleness;
  if (policy != PushPolicy::kApply && !within) {
    out.version = version_;
    return out;
  }
  const std::byte* add = delta;
  if (policy == PushPolicy::kScale && out.lag > 0) {
    out.factor = 1.0 / static_cast<double>(1 + out.lag);
    scaled.assign(delta, delta + values_.size());
    collectives::scale(scaled.data(), static_cast<std::size_t>(count_), dtype_, out.factor);
    add = scaled.data();
  }
  if (count_ > 0) {
    collectives::reduce_kernel(dtype_, ReduceOp::kSum)(values_.data(), add,
                                                       static_cast<std::size_t>(count_));
  }
  out.applied = true;
  out.version = ++version_;
  return out;
}

}  // namespace gyre::core::store
