// LocalSgd's per-parameter arithmetic (local_sgd_wire.h).
#include "local_sgd_wire.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "gyre/collectives/float16.h"

namespace gyre::local_sgd_detail {

namespace {

std::uint16_t to_16(float v, LocalSgdCompression c) {
  return c == LocalSgdCompression::kFloat16 ? collectives::float_to_half(v)
                                            : collectives::float_to_bf16(v);
}

float from_16(std::uint16_t v, LocalSgdCompression c) {
  return c == LocalSgdCompression::kFloat16 ? collectives::half_to_float(v)
                                            : collectives::bf16_to_float(v);
}

template <typename T>
void pseudo_gradient_t(Slot& s, LocalSgdCompression c) {
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

template <typename T>
void outer_step_t(Slot& s, LocalSgdCompression c, const OuterOptimizer& o) {
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
}

template <typename T>
void merge_t(Slot& s, double mixing) {
  const T* synced = reinterpret_cast<const T*>(s.synced.data());
  const T* start = reinterpret_cast<const T*>(s.at_start.data());
  T* local = static_cast<T*>(s.local.data);
  if (mixing < 0) {
    for (std::size_t i = 0; i < s.count; ++i) local[i] = synced[i] + (local[i] - start[i]);
    return;
  }
  const T a = static_cast<T>(mixing), b = static_cast<T>(1.0 - mixing);
  for (std::size_t i = 0; i < s.count; ++i) local[i] = a * local[i] + b * synced[i];
}

std::size_t blocks_of(std::size_t count) {
  return (count + kLocalSgdInt8Block - 1) / kLocalSgdInt8Block;
}

}  // namespace

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

void pseudo_gradient(Slot& s, LocalSgdCompression c) {
  if (s.local.dtype == DataType::kFloat32) {
    pseudo_gradient_t<float>(s, c);
  } else {
    pseudo_gradient_t<double>(s, c);
  }
}

void outer_step(Slot& s, LocalSgdCompression c, const OuterOptimizer& o) {
  if (s.local.dtype == DataType::kFloat32) {
    outer_step_t<float>(s, c, o);
  } else {
    outer_step_t<double>(s, c, o);
  }
}

void merge(Slot& s, bool drift, double mixing) {
  if (s.count == 0) return;
  if (!drift) {
    std::memcpy(s.local.data, s.synced.data(), s.local.nbytes());
  } else if (s.local.dtype == DataType::kFloat32) {
    merge_t<float>(s, mixing);
  } else {
    merge_t<double>(s, mixing);
  }
}

Int8Layout int8_layout(const std::vector<Slot*>& slots) {
  Int8Layout l;
  for (const Slot* s : slots) {
    l.values += s->count;
    l.scales += blocks_of(s->count);
  }
  l.scales_at = (l.values + 3) / 4 * 4;
  l.bytes = l.scales_at + l.scales * sizeof(float);
  return l;
}

void quantize(const std::vector<Slot*>& slots, const Int8Layout& l, std::byte* out) {
  auto* q = reinterpret_cast<std::int8_t*>(out);
  std::vector<float> scales;
  scales.reserve(l.scales);
  for (const Slot* s : slots) {
    const auto* v = reinterpret_cast<const float*>(s->wire.data());
    for (std::size_t b = 0; b < s->count; b += kLocalSgdInt8Block) {
      const std::size_t e = std::min(s->count, b + kLocalSgdInt8Block);
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

void dequantize_average(const std::vector<Slot*>& slots, const Int8Layout& l,
                        const std::byte* rows, std::size_t ranks) {
  for (Slot* s : slots) std::memset(s->wire.data(), 0, s->wire.size());
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::byte* row = rows + r * l.bytes;
    const auto* q = reinterpret_cast<const std::int8_t*>(row);
    const std::byte* scale_at = row + l.scales_at;  // the next block's scale
    for (Slot* s : slots) {
      auto* sum = reinterpret_cast<float*>(s->wire.data());
      for (std::size_t b = 0; b < s->count; b += kLocalSgdInt8Block) {
        float scale;
        std::memcpy(&scale, scale_at, sizeof(float));
        scale_at += sizeof(float);
        const std::size_t e = std::min(s->count, b + kLocalSgdInt8Block);
        for (std::size_t i = b; i < e; ++i) sum[i] += static_cast<float>(*q++) * scale;
      }
    }
  }
  const float n = static_cast<float>(ranks);
  for (Slot* s : slots) {
    auto* sum = reinterpret_cast<float*>(s->wire.data());
    for (std::size_t i = 0; i < s->count; ++i) sum[i] /= n;
  }
}

std::vector<std::size_t> fragment_cuts(const std::vector<std::size_t>& counts, int fragments) {
  const std::size_t n = counts.size(), f_count = static_cast<std::size_t>(fragments);
  std::vector<double> prefix(n + 1, 0.0);
  for (std::size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + static_cast<double>(counts[i]);
  std::vector<std::size_t> cuts{0};
  for (std::size_t f = 1; f < f_count; ++f) {
    const double target = static_cast<double>(f) * prefix[n] / static_cast<double>(f_count);
    const std::size_t lo = cuts.back() + 1, hi = n - (f_count - f);
    std::size_t best = lo;
    for (std::size_t i = lo + 1; i <= hi; ++i) {
      if (std::fabs(prefix[i] - target) < std::fabs(prefix[best] - target)) best = i;
    }
    cuts.push_back(best);
  }
  cuts.push_back(n);
  return cuts;
}

}  // namespace gyre::local_sgd_detail
