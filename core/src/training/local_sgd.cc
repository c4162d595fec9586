// LocalSgd (gyre/local_sgd.h): the argument checks, the start from the
// set's first rank, and the outer round, written on gyre.h's public calls
// alone (broadcast, grouped allreduce, commit_step). A round changes nothing
// until its allreduce has succeeded: the pseudo-gradients are computed into
// a buffer of their own, and θ_synced, the momentum and the caller's
// parameters are written only after the wait returned. Under int8
// compression the round is an allgather of every rank's quantized
// pseudo-gradients instead of an allreduce (int8_round).
#include "gyre/local_sgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "gyre/collectives/float16.h"
#include "gyre/elastic.h"

namespace gyre {

// One parameter: the caller's buffer and what LocalSgd keeps beside it, all
// in the parameter's dtype but for `wire` under compression (16-bit, or
// float32 for int8: the pseudo-gradient before quantization and the average
// after the round).
// Outside the anonymous namespace: LocalSgd::State holds them.
struct LocalSgdSlot {
  TensorView local;
  std::size_t count = 0;
  std::vector<std::byte> synced;    // θ_synced
  std::vector<std::byte> momentum;  // the outer optimizer's buffer (momentum > 0)
  std::vector<std::byte> wire;      // the pseudo-gradient as the allreduce carries it
};

namespace {

using Slot = LocalSgdSlot;

std::size_t wire_size(const Slot& s, LocalSgdCompression c) {
  switch (c) {
    case LocalSgdCompression::kNone: return s.local.nbytes();
    case LocalSgdCompression::kInt8: return s.count * sizeof(float);
    case LocalSgdCompression::kFloat16:
    case LocalSgdCompression::kBFloat16: break;
  }
  return s.count * sizeof(std::uint16_t);
}

DataType wire_dtype(const Slot& s, LocalSgdCompression c) {
  switch (c) {
    case LocalSgdCompression::kFloat16: return DataType::kFloat16;
    case LocalSgdCompression::kBFloat16: return DataType::kBFloat16;
    case LocalSgdCompression::kInt8: return DataType::kFloat32;
    case LocalSgdCompression::kNone: break;
  }
  return s.local.dtype;
}

std::uint16_t to_16(float v, LocalSgdCompression c) {
  return c == LocalSgdCompression::kFloat16 ? collectives::float_to_half(v)
                                            : collectives::float_to_bf16(v);
}

float from_16(std::uint16_t v, LocalSgdCompression c) {
  return c == LocalSgdCompression::kFloat16 ? collectives::half_to_float(v)
                                            : collectives::bf16_to_float(v);
}

// wire = θ_synced − θ_local, in T, in float32 (int8: quantized later), or
// cast to 16 bits.
template <typename T>
void pseudo_gradient(Slot& s, LocalSgdCompression c) {
  const T* synced = reinterpret_cast<const T*>(s.synced.data());
  const T* local = static_cast<const T*>(s.local.data);
  if (c == LocalSgdCompression::kNone) {
    T* out = reinterpret_cast<T*>(s.wire.data());
    for (std::size_t i = 0; i < s.count; ++i) out[i] = synced[i] - local[i];
    return;
  }
  if (c == LocalSgdCompression::kInt8) {
    auto* out = reinterpret_cast<float*>(s.wire.data());
    for (std::size_t i = 0; i < s.count; ++i) out[i] = static_cast<float>(synced[i] - local[i]);
    return;
  }
  auto* out = reinterpret_cast<std::uint16_t*>(s.wire.data());
  for (std::size_t i = 0; i < s.count; ++i) {
    out[i] = to_16(static_cast<float>(synced[i] - local[i]), c);
  }
}

// The outer optimizer's step on θ_synced with the averaged pseudo-gradient
// in `wire` (torch.optim.SGD's update, in T), then θ_local = θ_synced.
template <typename T>
void outer_step(Slot& s, LocalSgdCompression c, const OuterOptimizer& o) {
  T* synced = reinterpret_cast<T*>(s.synced.data());
  T* buf = s.momentum.empty() ? nullptr : reinterpret_cast<T*>(s.momentum.data());
  const T* wire = reinterpret_cast<const T*>(s.wire.data());
  const auto* wire16 = reinterpret_cast<const std::uint16_t*>(s.wire.data());
  const auto* wire32 = reinterpret_cast<const float*>(s.wire.data());
  const T lr = static_cast<T>(o.lr), m = static_cast<T>(o.momentum);
  for (std::size_t i = 0; i < s.count; ++i) {
    const T g = c == LocalSgdCompression::kNone   ? wire[i]
                : c == LocalSgdCompression::kInt8 ? static_cast<T>(wire32[i])
                                                  : static_cast<T>(from_16(wire16[i], c));
    T d = g;
    if (buf != nullptr) {
      buf[i] = m * buf[i] + g;
      d = o.nesterov ? g + m * buf[i] : buf[i];
    }
    synced[i] -= lr * d;
  }
  if (s.count > 0) std::memcpy(s.local.data, s.synced.data(), s.local.nbytes());
}

// Waits for every handle, then rethrows the first failure: no operation is
// left in flight on buffers the caller may free once this throws.
void wait_all(const std::vector<Handle>& handles) {
  std::exception_ptr first;
  for (const auto& h : handles) {
    try {
      h.wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// The int8 message of one rank, one row of the round's allgather: every
// slot's values (int8, in slot order), zero bytes up to a multiple of 4,
// then every slot's block scales (float32, in slot order).
struct Int8Layout {
  std::size_t values = 0;  // int8 values in all (the parameters' elements)
  std::size_t scales = 0;  // blocks in all
  std::size_t scales_at = 0;
  std::size_t bytes = 0;
};

std::size_t blocks_of(std::size_t count) {
  return (count + kLocalSgdInt8Block - 1) / kLocalSgdInt8Block;
}

Int8Layout int8_layout(const std::vector<Slot>& slots) {
  Int8Layout l;
  for (const Slot& s : slots) {
    l.values += s.count;
    l.scales += blocks_of(s.count);
  }
  l.scales_at = (l.values + 3) / 4 * 4;
  l.bytes = l.scales_at + l.scales * sizeof(float);
  return l;
}

// Quantizes every slot's float32 `wire` into `out` (int8_layout's bytes):
// per block, scale = absmax / 127 and q = round(v / scale) in [-127, 127];
// an all-zero block has scale 0 and q 0. A block holding a NaN or an
// infinity gets a NaN scale (and q 0): its average becomes NaN on every rank,
// as it would uncompressed, instead of an arbitrary number.
void quantize(const std::vector<Slot>& slots, const Int8Layout& l, std::byte* out) {
  auto* q = reinterpret_cast<std::int8_t*>(out);
  std::vector<float> scales;
  scales.reserve(l.scales);
  for (const Slot& s : slots) {
    const auto* v = reinterpret_cast<const float*>(s.wire.data());
    for (std::size_t b = 0; b < s.count; b += kLocalSgdInt8Block) {
      const std::size_t e = std::min(s.count, b + kLocalSgdInt8Block);
      float absmax = 0;
      bool finite = true;
      for (std::size_t i = b; i < e; ++i) {
        finite = finite && std::isfinite(v[i]);
        absmax = std::max(absmax, std::fabs(v[i]));
      }
      const float scale = finite ? absmax / 127.0f : std::numeric_limits<float>::quiet_NaN();
      for (std::size_t i = b; i < e; ++i) {
        float r = 0;
        if (finite && scale > 0) r = std::clamp(std::nearbyint(v[i] / scale), -127.0f, 127.0f);
        *q++ = static_cast<std::int8_t>(r);
      }
      scales.push_back(scale);
    }
  }
  std::memset(out + l.values, 0, l.scales_at - l.values);
  if (!scales.empty()) std::memcpy(out + l.scales_at, scales.data(), scales.size() * sizeof(float));
}

// Every slot's `wire` = the average over the gathered rows (one per rank,
// in rank order) of their dequantized values, summed in float32 in rank
// order: the same arithmetic on every rank, so the same result.
void dequantize_average(std::vector<Slot>& slots, const Int8Layout& l, const std::byte* rows,
                        std::size_t ranks) {
  for (Slot& s : slots) std::memset(s.wire.data(), 0, s.wire.size());
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::byte* row = rows + r * l.bytes;
    const auto* q = reinterpret_cast<const std::int8_t*>(row);
    const std::byte* scale_at = row + l.scales_at;  // the next block's scale
    for (Slot& s : slots) {
      auto* sum = reinterpret_cast<float*>(s.wire.data());
      for (std::size_t b = 0; b < s.count; b += kLocalSgdInt8Block) {
        float scale;
        std::memcpy(&scale, scale_at, sizeof(float));
        scale_at += sizeof(float);
        const std::size_t e = std::min(s.count, b + kLocalSgdInt8Block);
        for (std::size_t i = b; i < e; ++i) sum[i] += static_cast<float>(*q++) * scale;
      }
    }
  }
  const float n = static_cast<float>(ranks);
  for (Slot& s : slots) {
    auto* sum = reinterpret_cast<float*>(s.wire.data());
    for (std::size_t i = 0; i < s.count; ++i) sum[i] /= n;
  }
}

void check_options(const LocalSgdOptions& o) {
  auto bad = [](const std::string& what) { throw InvalidArgument("LocalSgd: " + what); };
  if (o.period < 1) bad(fmt::format("period must be >= 1, got {}", o.period));
  if (o.warmup_steps < 0) bad(fmt::format("warmup_steps must be >= 0, got {}", o.warmup_steps));
  if (!(std::isfinite(o.outer.lr) && o.outer.lr > 0)) {
    bad(fmt::format("the outer optimizer's lr must be positive and finite, got {}", o.outer.lr));
  }
  if (!(o.outer.momentum >= 0 && o.outer.momentum < 1)) {
    bad(fmt::format("the outer optimizer's momentum must be in [0, 1), got {}", o.outer.momentum));
  }
  if (o.outer.nesterov && o.outer.momentum == 0) {
    bad("the outer optimizer's Nesterov correction needs a momentum above 0");
  }
  if (o.compression != LocalSgdCompression::kNone &&
      o.compression != LocalSgdCompression::kFloat16 &&
      o.compression != LocalSgdCompression::kBFloat16 &&
      o.compression != LocalSgdCompression::kInt8) {
    bad(fmt::format("unknown compression {}", static_cast<int>(o.compression)));
  }
  if (o.name.empty()) bad("name (the prefix of the operations' names) is empty");
}

void check_params(const std::vector<TensorView>& params) {
  auto bad = [](std::size_t i, const std::string& what) {
    throw InvalidArgument(fmt::format("LocalSgd: parameter {} {}", i, what));
  };
  if (params.empty()) throw InvalidArgument("LocalSgd: no parameters given");
  for (std::size_t i = 0; i < params.size(); ++i) {
    const TensorView& p = params[i];
    if (!p.refusal.empty()) bad(i, fmt::format("cannot be taken: {}", p.refusal));
    if (p.dtype != DataType::kFloat32 && p.dtype != DataType::kFloat64) {
      bad(i, fmt::format("has dtype {}; LocalSgd takes float32 and float64 parameters",
                         dtype_name(p.dtype)));
    }
    if (p.device.type != DeviceType::kCPU) {
      bad(i, fmt::format("is on {}; LocalSgd takes host parameters", device_name(p.device.type)));
    }
    for (auto d : p.shape) {
      if (d < 0) bad(i, fmt::format("has a negative dimension ({})", d));
    }
    if (p.data == nullptr && p.numel() > 0) bad(i, "has a null buffer");
    for (std::size_t j = 0; j < i; ++j) {
      if (p.data != nullptr && p.data == params[j].data) {
        bad(i, fmt::format("is the same buffer as parameter {}", j));
      }
    }
  }
}

}  // namespace

struct LocalSgd::State {
  LocalSgdOptions options;
  std::vector<Slot> slots;
  std::vector<std::string> round_names;
  std::int64_t local_steps = 0;
  std::int64_t rounds = 0;
  std::uint64_t version = 0;

  void round();
  void int8_round();
};

LocalSgd::LocalSgd(const LocalSgdOptions& options, std::vector<TensorView> params)
    : state_(std::make_unique<State>()) {
  check_options(options);
  check_params(params);
  State& st = *state_;
  st.options = options;

  // Every rank starts from the set's first rank's parameters.
  const auto members = process_set_ranks(options.process_set);
  if (members.empty()) {
    throw InvalidArgument(
        fmt::format("LocalSgd: process set {} has no ranks", options.process_set));
  }
  std::vector<Handle> started;
  for (std::size_t i = 0; i < params.size(); ++i) {
    started.push_back(broadcast_async(fmt::format("{}.init.{}", options.name, i), params[i],
                                      members.front(), options.process_set));
  }
  wait_all(started);

  for (std::size_t i = 0; i < params.size(); ++i) {
    Slot s;
    s.local = params[i];
    s.count = static_cast<std::size_t>(params[i].numel());
    const std::size_t bytes = s.local.nbytes();
    s.synced.resize(bytes);
    if (bytes > 0) std::memcpy(s.synced.data(), s.local.data, bytes);
    if (options.outer.momentum > 0) s.momentum.assign(bytes, std::byte{0});
    s.wire.resize(wire_size(s, options.compression));
    st.slots.push_back(std::move(s));
    st.round_names.push_back(fmt::format("{}.round.{}", options.name, i));
  }
}

LocalSgd::~LocalSgd() = default;
LocalSgd::LocalSgd(LocalSgd&&) noexcept = default;
LocalSgd& LocalSgd::operator=(LocalSgd&&) noexcept = default;

void LocalSgd::State::round() {
  const LocalSgdCompression c = options.compression;
  for (Slot& s : slots) {
    if (s.local.dtype == DataType::kFloat32) {
      pseudo_gradient<float>(s, c);
    } else {
      pseudo_gradient<double>(s, c);
    }
  }
  if (c == LocalSgdCompression::kInt8) {
    int8_round();
  } else {
    std::vector<TensorView> wires;
    wires.reserve(slots.size());
    for (Slot& s : slots) {
      void* data = s.wire.empty() ? nullptr : s.wire.data();
      wires.push_back(TensorView{data, wire_dtype(s, c), s.local.shape});
    }
    grouped_allreduce_async(round_names, wires, wires, ReduceOp::kAverage, 1.0, 1.0,
                            options.process_set)
        .wait();
  }
  for (Slot& s : slots) {
    if (s.local.dtype == DataType::kFloat32) {
      outer_step<float>(s, c, options.outer);
    } else {
      outer_step<double>(s, c, options.outer);
    }
  }
  if (options.commit && options.process_set == kGlobalProcessSet) {
    commit_step();
    version = committed_steps();
  }
  ++rounds;
}

void LocalSgd::State::int8_round() {
  const Int8Layout l = int8_layout(slots);
  std::vector<std::byte> mine(l.bytes);
  quantize(slots, l, mine.data());
  const Handle h = allgather_async(
      options.name + ".round.int8",
      TensorView{mine.data(), DataType::kUInt8, {1, static_cast<std::int64_t>(l.bytes)}},
      options.process_set);
  h.wait();
  const OwnedTensor& rows = h.output();
  // Counted now, not at construction: after an elastic rebuild the set
  // holds the survivors.
  const std::size_t ranks = process_set_ranks(options.process_set).size();
  if (ranks == 0 || rows.data.size() != ranks * l.bytes) {
    // Every rank's parameter shapes were checked equal at construction (its
    // broadcasts): a different row size means a rank changed them since.
    throw MismatchError(fmt::format(
        "LocalSgd: the int8 round gathered {} bytes, expected {} ranks x {}: the ranks' "
        "parameters no longer have the same shapes",
        rows.data.size(), ranks, l.bytes));
  }
  dequantize_average(slots, l, rows.data.data(), ranks);
}

bool LocalSgd::step() {
  State& st = *state_;
  const std::int64_t next = st.local_steps + 1;
  const bool due = next <= st.options.warmup_steps || next % st.options.period == 0;
  if (due) st.round();
  st.local_steps = next;
  return due;
}

void LocalSgd::sync() { state_->round(); }

void LocalSgd::add_to(elastic::State& state) {
  State& st = *state_;
  const LocalSgdOptions& o = st.options;
  if (o.commit && o.process_set == kGlobalProcessSet) {
    throw InvalidArgument(
        "LocalSgd::add_to: this LocalSgd commits its rounds itself (.commit = true); with an "
        "elastic State the State's commit() is the round's commit: construct it with "
        ".commit = false and call state.commit() after each step() that ran a round");
  }
  for (std::size_t i = 0; i < st.slots.size(); ++i) {
    Slot& s = st.slots[i];
    // The State writes these buffers back on a recovery: LocalSgd owns them
    // (allocated once, never resized), the State only copies their bytes.
    state.add(fmt::format("{}.synced.{}", o.name, i), s.synced.data(), s.local.dtype,
              static_cast<std::int64_t>(s.count));
    if (!s.momentum.empty()) {
      state.add(fmt::format("{}.momentum.{}", o.name, i), s.momentum.data(), s.local.dtype,
                static_cast<std::int64_t>(s.count));
    }
  }
  state.add(o.name + ".local_steps", &st.local_steps, DataType::kInt64, 1);
  state.add(o.name + ".rounds", &st.rounds, DataType::kInt64, 1);
}

std::int64_t LocalSgd::local_steps() const { return state_->local_steps; }
std::int64_t LocalSgd::rounds() const { return state_->rounds; }
std::uint64_t LocalSgd::version() const { return state_->version; }
const LocalSgdOptions& LocalSgd::options() const { return state_->options; }

}  // namespace gyre
