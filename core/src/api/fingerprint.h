// Fingerprints of buffers for fingerprint_check(): a fast, non-cryptographic
// 64-bit hash of the bytes, which the call computes before it enqueues (the
// executor compares the ranks' digests: execution/executor_sync.cc). Pure
// functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gyre::core {

// Hash of `bytes` bytes at `data`. Different lengths give different digests.
std::uint64_t hash_bytes(const void* data, std::size_t bytes, std::uint64_t seed = 0);

// Folds a string into a running hash (names and layouts of buffer lists).
std::uint64_t hash_combine(std::uint64_t h, std::string_view s);

}  // namespace gyre::core
