// Executor: the divergence tools, fingerprint_check and resync.
#include <map>

#include <fmt/format.h>

#include "execution/executor.h"

namespace gyre::core {

std::vector<FingerprintMismatch> find_mismatches(
    const std::vector<std::string>& names,
    const std::vector<std::vector<std::uint64_t>>& digests) {
  std::vector<FingerprintMismatch> out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::map<std::uint64_t, std::vector<int>> groups;
    for (std::size_t r = 0; r < digests.size(); ++r) {
      if (i < digests[r].size()) groups[digests[r][i]].push_back(static_cast<int>(r));
    }
    if (groups.size() <= 1) continue;
    FingerprintMismatch m;
    m.name = names[i];
    for (auto& [d, ranks] : groups) m.groups.emplace_back(d, std::move(ranks));
    out.push_back(std::move(m));
  }
  return out;
}

void Executor::run_fingerprint(Response& resp, Entry& entry) {
  // The digests travelled in the requests (digests[0] hashes the names,
  // then one digest per buffer): nothing left to send.
  std::vector<std::vector<std::uint64_t>> digests(resp.per_rank.size());
  for (std::size_t r = 0; r < resp.per_rank.size(); ++r) {
    const auto& d = resp.per_rank[r]->digests;
    digests[r].assign(d.begin() + 1, d.end());
  }
  entry->state->mismatches = find_mismatches(entry->buffer_names, digests);
}

void Executor::run_resync(Response& resp, Entry& entry) {
  // The newest rank is the one with the highest committed step, the lowest
  // such rank on ties.
  const bool average = resp.agreed.resync_policy == ResyncPolicy::kAverage;
  int root = 0;
  std::uint64_t newest = 0;
  for (std::size_t r = 0; r < resp.per_rank.size(); ++r) {
    std::uint64_t s = resp.per_rank[r]->step;
    if (s > newest) {
      newest = s;
      root = static_cast<int>(r);
    }
  }
  // Host buffers only (CUDA ones are refused at enqueue).
  Backend& cpu = backends_.host();
  const std::string_view name = resp.name;
  const OpLabel what{"resync", std::span(&name, 1)};
  const Reduction mean = effective_reduction(ReduceOp::kAverage, 1.0, 1.0, resp.contributors);
  for (const TensorView& b : entry->buffers) {
    if (average) {
      cpu.allreduce(b.data, b.data, static_cast<std::size_t>(b.numel()), b.dtype, mean, what);
    } else {
      cpu.broadcast(b.data, b.nbytes(), root, what);
    }
  }
  vv_.set_all(newest);
  log_.info("resync ({}): {} buffers {} rank {}; every rank now at step {}",
            average ? "average" : "newest", entry->buffers.size(),
            average ? "averaged, newest is" : "copied from", root, newest);
}

}  // namespace gyre::core
