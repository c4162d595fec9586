// The operations of gyre.h, forwarded to the runtime a call names (the
// world's or a process set's: lifecycle.h) and the checks of operations.h.
#include <algorithm>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "api/lifecycle.h"
#include "api/operations.h"
#include "api/point_to_point.h"
#include "api/process_sets.h"
#include "gyre/gyre.h"
#include "store/store_totals.h"

namespace gyre {

using api::g_mu;
using api::g_p2p;
using api::g_sets;
using api::g_sets_change_mu;
using api::p2p_unavailable;
using api::ranks_of;
using api::runtime;
using api::runtime_for;

Handle allreduce_async(const std::string& name, const TensorView& in, const TensorView& out,
                       ReduceOp op, double prescale, double postscale, int process_set) {
  return core::allreduce_async(*runtime_for("allreduce_async", process_set), name, in, out, op,
                               prescale, postscale);
}
void allreduce(const std::string& name, const TensorView& in, const TensorView& out, ReduceOp op,
               double prescale, double postscale, int process_set) {
  WaitFollows wait_follows;
  core::allreduce_async(*runtime_for("allreduce", process_set), name, in, out, op, prescale,
                        postscale)
      .wait();
}
Handle grouped_allreduce_async(const std::vector<std::string>& names,
                               const std::vector<TensorView>& ins,
                               const std::vector<TensorView>& outs, ReduceOp op, double prescale,
                               double postscale, int process_set) {
  return core::grouped_allreduce_async(*runtime_for("grouped_allreduce_async", process_set),
                                       names, ins, outs, op, prescale, postscale);
}
Handle allgather_async(const std::string& name, const TensorView& in, int process_set) {
  return core::allgather_async(*runtime_for("allgather_async", process_set), name, in);
}
Handle broadcast_async(const std::string& name, const TensorView& buf, int root,
                       int process_set) {
  auto rt = runtime_for("broadcast_async", process_set);
  if (process_set == kGlobalProcessSet) return core::broadcast_async(*rt, name, buf, root);
  // Roots are world ranks (Horovod's); the set's runtime counts its own.
  const std::vector<int> ranks = ranks_of("broadcast_async", process_set);
  auto it = std::find(ranks.begin(), ranks.end(), root);
  if (it != ranks.end()) {
    return core::broadcast_async(*rt, name, buf, static_cast<int>(it - ranks.begin()));
  }
  // Refused there, and announced to the set's other ranks with the reason.
  TensorView refused = buf;
  if (refused.refusal.empty()) {
    refused.refusal = fmt::format("root rank {} is not in process set {} (ranks [{}])", root,
                                  process_set, fmt::join(ranks, ", "));
  }
  return core::broadcast_async(*rt, name, refused, 0);
}
Handle alltoall_async(const std::string& name, const TensorView& in,
                      const std::vector<std::int64_t>& splits, int process_set) {
  return core::alltoall_async(*runtime_for("alltoall_async", process_set), name, in, splits);
}
Handle reducescatter_async(const std::string& name, const TensorView& in, ReduceOp op,
                           double prescale, double postscale, int process_set) {
  return core::reducescatter_async(*runtime_for("reducescatter_async", process_set), name, in,
                                   op, prescale, postscale);
}
namespace {
// send_async and recv_async: the engine (or why there is none), then the op.
Handle point_to_point(const char* call, bool is_send, const TensorView& t, int peer,
                      std::int64_t tag, int process_set) {
  auto world = runtime(call);
  std::shared_ptr<core::P2pEngine> engine;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    engine = g_p2p;
  }
  if (!engine) throw InvalidArgument(p2p_unavailable(call));
  return core::point_to_point_async(*engine, is_send, t, peer, tag, process_set,
                                    ranks_of(call, process_set), world->rank());
}
}  // namespace

Handle send_async(const TensorView& t, int dst, std::int64_t tag, int process_set) {
  return point_to_point("send_async", true, t, dst, tag, process_set);
}
Handle recv_async(const TensorView& t, int src, std::int64_t tag, int process_set) {
  return point_to_point("recv_async", false, t, src, tag, process_set);
}
void barrier(int process_set) { core::barrier(*runtime_for("barrier", process_set)); }
int join(int process_set) {
  const int last = core::join(*runtime_for("join", process_set));
  if (process_set == kGlobalProcessSet || last < 0) return last;
  return ranks_of("join", process_set).at(static_cast<std::size_t>(last));
}
Handle barrier_async(int process_set) {
  return core::barrier_async(*runtime_for("barrier", process_set));
}
Handle join_async(int process_set) { return core::join_async(*runtime_for("join", process_set)); }

int add_process_set(const std::vector<int>& ranks) {
  auto world = runtime("add_process_set");
  std::lock_guard<std::mutex> lock(g_sets_change_mu);
  return core::add_process_set(*world, g_sets, ranks);
}
int add_process_set_of_members(const std::vector<int>& ranks, double timeout_s) {
  auto world = runtime("add_process_set");
  std::lock_guard<std::mutex> lock(g_sets_change_mu);
  return core::add_process_set_of_members(*world, g_sets, ranks, timeout_s);
}
void remove_process_set(int process_set) {
  auto world = runtime("remove_process_set");
  std::lock_guard<std::mutex> lock(g_sets_change_mu);
  core::remove_process_set(*world, g_sets, process_set);
}
std::vector<int> process_set_ids() {
  runtime("process_set_ids");
  std::vector<int> ids{kGlobalProcessSet};
  for (int id : g_sets.ids()) ids.push_back(id);
  return ids;
}
std::vector<int> process_set_ranks(int process_set) {
  return ranks_of("process_set_ranks", process_set);
}
int process_set_rank(int process_set) {
  const auto ranks = ranks_of("process_set_rank", process_set);
  auto it = std::find(ranks.begin(), ranks.end(), rank());
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}
int process_set_size(int process_set) {
  return static_cast<int>(ranks_of("process_set_size", process_set).size());
}
bool process_set_included(int process_set) { return process_set_rank(process_set) >= 0; }
void set_operation_timeout(int process_set, const std::string& name_prefix, double seconds) {
  runtime_for("set_operation_timeout", process_set)
      ->stall_inspector()
      .set_deadline(name_prefix, seconds);
}
void start_timeline(const std::string& path, bool mark_cycles) {
  runtime("start_timeline")->start_timeline(path, mark_cycles);
}
void stop_timeline() { runtime("stop_timeline")->stop_timeline(); }

RuntimeStats runtime_stats() {
  auto rt = runtime("runtime_stats");
  RuntimeStats st;
  const core::Runtime::NegotiationCounters nc = rt->negotiation_counters();
  st.rounds = nc.rounds;
  st.requests_sent = nc.requests_sent;
  st.cache_hits_sent = nc.cache_hits_sent;
  st.log_depth_rounds = nc.log_depth_rounds;
  st.speculated_allreduces = nc.speculated;
  st.speculation = rt->speculation();
  st.negotiation_messages = nc.messages;
  st.negotiation_tier_hosts = rt->negotiation_tier_hosts();
  st.caller_rounds = rt->caller_rounds();
  st.rounds_left_to_callers = rt->rounds_left_to_callers();
  st.caller_handoffs = rt->caller_handoffs();
  st.transport_messages = rt->transport_messages();
  st.transport_bytes = rt->transport_bytes();
  st.versions = rt->versions().snapshot();
  st.behind = core::steps_behind(st.versions);
  const core::StoreTotals& totals = core::store_totals();
  st.store_pushes = totals.pushes.load();
  st.store_pushes_applied = totals.applied.load();
  st.store_pushes_rejected = totals.rejected.load();
  st.store_pushes_scaled = totals.scaled.load();
  st.store_max_lag = totals.max_lag.load();
  st.pool_allreduces = rt->shm_host() ? rt->shm_host()->pool_allreduces() : 0;
  const core::LayoutCost& link = rt->link_cost();
  st.link_source = rt->link_source();
  st.net_alpha_s = link.net.alpha_s;
  st.net_bytes_per_s = 1.0 / link.net.beta_s_per_b;
  st.shm_alpha_s = link.shm.alpha_s;
  st.shm_bytes_per_s = 1.0 / link.shm.beta_s_per_b;
  st.autotune = rt->tuned_allreduces();
  return st;
}

void commit_step() { runtime("commit_step")->versions().commit(); }
std::uint64_t committed_steps() { return runtime("committed_steps")->versions().own(); }
std::vector<std::uint64_t> version_vector() {
  return runtime("version_vector")->versions().snapshot();
}
std::vector<FingerprintMismatch> fingerprint_check(const std::vector<NamedBuffer>& buffers) {
  return core::fingerprint_check(*runtime("fingerprint_check"), buffers);
}
void resync(const std::vector<NamedBuffer>& buffers, ResyncPolicy policy) {
  core::resync(*runtime("resync"), buffers, policy);
}
Handle fingerprint_check_async(const std::vector<NamedBuffer>& buffers) {
  return core::fingerprint_check_async(*runtime("fingerprint_check"), buffers);
}
Handle resync_async(const std::vector<NamedBuffer>& buffers, ResyncPolicy policy) {
  return core::resync_async(*runtime("resync"), buffers, policy);
}

}  // namespace gyre
