// Fingerprints of buffers for fingerprint_check(): a fast, non-cryptographic
// 64-bit hash of the bytes, and the grouping of per-rank digests into
// mismatches. Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gyre/gyre.h"

namespace gyre::core {

// Hash of `bytes` bytes at `data`. Different lengths give different digests.
std::uint64_t hash_bytes(const void* data, std::size_t bytes, std::uint64_t seed = 0);

// Folds a string into a running hash (names and layouts of buffer lists).
std::uint64_t hash_combine(std::uint64_t h, std::string_view s);

// digests[r][i]: rank r's digest of buffer i (every rank has names.size()).
// Returns the buffers whose digests differ, groups in ascending digest order.
std::vector<FingerprintMismatch> find_mismatches(
    const std::vector<std::string>& names, const std::vector<std::vector<std::uint64_t>>& digests);

}  // namespace gyre::core
