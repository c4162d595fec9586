// gyre::elastic::State and run() (core/include/gyre/elastic.h).
#include <cstdio>
#include <cstring>
#include <string>

#include "gyre/elastic.h"

namespace gyre::elastic {

void State::add(const std::string& name, void* data, DataType dtype, std::int64_t count) {
  if (name.empty()) throw InvalidArgument("gyre::elastic::State::add: empty name");
  if (data == nullptr && count > 0) {
    throw InvalidArgument("gyre::elastic::State::add: buffer '" + name + "' is null");
  }
  if (count < 0) {
    throw InvalidArgument("gyre::elastic::State::add: buffer '" + name + "' has a negative count " +
                          std::to_string(count));
  }
  for (const Buffer& b : buffers_) {
    if (b.name == name) {
      throw InvalidArgument("gyre::elastic::State::add: a buffer named '" + name +
                            "' is already in the state");
    }
  }
  const std::size_t bytes = static_cast<std::size_t>(count) * dtype_size(dtype);
  Buffer b{name, data, dtype, count, std::vector<std::byte>(bytes)};
  if (bytes > 0) std::memcpy(b.saved.data(), data, bytes);
  buffers_.push_back(std::move(b));
}

void State::commit() {
  for (Buffer& b : buffers_) {
    if (!b.saved.empty()) std::memcpy(b.saved.data(), b.data, b.saved.size());
  }
  commit_step();
  ++commits_;
  committed_at_ = committed_steps();
}

void State::restore() {
  for (Buffer& b : buffers_) {
    if (!b.saved.empty()) std::memcpy(b.data, b.saved.data(), b.saved.size());
  }
}

void State::sync(int root) {
  std::vector<Handle> handles;
  handles.reserve(buffers_.size());
  for (Buffer& b : buffers_) {
    TensorView v{b.data, b.dtype, {b.count}};
    handles.push_back(broadcast_async("elastic.state." + b.name, v, root));
  }
  for (Handle& h : handles) h.wait();
  for (Buffer& b : buffers_) {
    if (!b.saved.empty()) std::memcpy(b.saved.data(), b.data, b.saved.size());
  }
  committed_at_ = committed_steps();
  for (auto& cb : sync_callbacks_) cb();
}

void run(State& state, const std::function<void(State&)>& fn) {
  bool need_sync = true;
  // A replacement rank (GYRE_ELASTIC_RESPAWN) takes the agreed commit from
  // the rank the survivors sync from, as they do after their rebuild().
  int first_root = is_replacement() ? replacement_info().root : 0;
  bool joining = is_replacement();  // until it holds the committed state
  for (;;) {
    try {
      if (need_sync) state.sync(first_root);
      first_root = 0;
      joining = false;
      need_sync = false;
      fn(state);
      return;
    } catch (const RankFailedError& e) {
      Recovery r;
      r.failed_at = std::chrono::steady_clock::now();
      r.own_commit = committed_steps();
      for (auto& cb : state.failure_callbacks_) cb(e);
      if (joining) {
        // Nothing to go back to: the survivors' next rebuild counts this
        // rank as failed (it ends) and may start another in its place.
        throw StateError(std::string("gyre::elastic::run: a rank failed before this replacement "
                                     "rank received the committed state: ") + e.what());
      }
      if (r.own_commit != state.committed_at_) {
        throw StateError("gyre::elastic::run: this rank committed " +
                         std::to_string(r.own_commit) + " steps but its State holds step " +
                         std::to_string(state.committed_at_) +
                         ": call State::commit() instead of gyre::commit_step()");
      }
      // Rebuild, back to this rank's commit, then the root's (at the agreed
      // step). A failure during that broadcast rebuilds again: the ranks
      // whose commit is the agreed step still hold it; a rank that was one
      // commit ahead no longer holds the agreed step's state and stops.
      for (;;) {
        r.info = rebuild();
        const std::uint64_t mine = state.committed_at_;
        if (mine < r.info.step || mine > r.info.step + 1) {
          throw StateError("gyre::elastic::run: the survivors agreed on step " +
                           std::to_string(r.info.step) + " but this rank's State holds step " +
                           std::to_string(mine));
        }
        state.restore();
        try {
          state.sync(r.info.root);
          break;
        } catch (const RankFailedError&) {
          if (mine != r.info.step) {
            throw StateError("gyre::elastic::run: a rank failed while this rank, one commit "
                             "ahead, took the agreed step " + std::to_string(r.info.step) +
                             " from rank " + std::to_string(r.info.root) +
                             ": it no longer holds that step's state");
          }
        }
      }
      if (r.info.rank == 0) {
        std::fprintf(stderr,
                     "gyre::elastic::run: lost %zu rank(s); going on with %d ranks from step %llu "
                     "(rebuilt in %.3f s)\n",
                     r.info.lost.size(), r.info.size,
                     static_cast<unsigned long long>(r.info.step), r.info.seconds);
      }
      for (auto& cb : state.reset_callbacks_) cb(r);
    }
  }
}

}  // namespace gyre::elastic
