// One shard of the parameter store on its owner: the values and the version,
// changed together under one mutex. Pure of communication: the owner's
// server thread and its own user threads call it alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "gyre/store.h"
#include "gyre/types.h"

namespace gyre::core::store {

struct PushOutcome {
  bool applied = false;
  std::int64_t version = 0;  // after the push (the current one if rejected)
  std::int64_t lag = 0;      // version before the push - base
  double factor = 1.0;       // what delta was multiplied by (kScale)
};

class Shard {
 public:
  Shard(DataType dtype, std::int64_t count, const std::byte* initial);

  DataType dtype() const { return dtype_; }
  std::int64_t count() const { return count_; }
  std::size_t nbytes() const { return values_.size(); }

  // Copies the values into `out` (nbytes()) and returns their version.
  std::int64_t read(std::byte* out) const;
  // Applies `delta` (count() elements of dtype()) as `policy` says, given the
  // version it was computed from. staleness < 0: no bound. Throws
  // InvalidArgument for a base version this shard never had (ahead of it or
  // negative), or kScale on bool.
  PushOutcome push(const std::byte* delta, std::int64_t base, std::int64_t staleness,
                   PushPolicy policy);
  // Throws what push() would throw for `base` and `policy`, changing
  // nothing: a request of several pushes is checked whole before any is
  // applied. (A base that passes stays valid: versions only grow.)
  void check_push(std::int64_t base, PushPolicy policy) const;

 private:
  const DataType dtype_;
  const std::int64_t count_;
  mutable std::mutex mu_;  // guards values_ and version_, changed together
  std::vector<std::byte> values_;
  std::int64_t version_ = 0;
};

}  // namespace gyre::core::store
