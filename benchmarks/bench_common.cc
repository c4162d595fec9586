#include "bench_common.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include <fmt/format.h>

#include "gyre/error.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace gyre::bench {
namespace {

// float16 and bfloat16 are stored as raw 16-bit patterns; the benchmark only
// needs exact conversions of small integers and halves, but rounds to nearest
// even like the hardware formats do.
std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t fexp = (x >> 23) & 0xffu;
  std::uint32_t mant = x & 0x7fffffu;
  if (fexp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int exp = static_cast<int>(fexp) - 127 + 15;
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {  // subnormal half
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = sign | (static_cast<std::uint32_t>(exp) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry rolls into the exponent
  return static_cast<std::uint16_t>(h);
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float bf16_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

struct Half { std::uint16_t bits; };
struct BFloat { std::uint16_t bits; };

template <typename T> T encode(double v) { return static_cast<T>(v); }
template <> Half encode<Half>(double v) { return {float_to_half(static_cast<float>(v))}; }
template <> BFloat encode<BFloat>(double v) { return {float_to_bf16(static_cast<float>(v))}; }
template <typename T> double decode(T v) { return static_cast<double>(v); }
template <> double decode<Half>(Half v) { return half_to_float(v.bits); }
template <> double decode<BFloat>(BFloat v) { return bf16_to_float(v.bits); }

double input_value(std::size_t i, ReduceOp op, int rank, int world) {
  const std::size_t n = static_cast<std::size_t>(world);
  const std::size_t r = static_cast<std::size_t>(rank);
  if (op == ReduceOp::kProduct) return 1.0 + static_cast<double>((r + i) % 2);
  return static_cast<double>((r + i) % n + i % 7);
}

// Relative tolerance for average, whose 1/n is rounded in the element type.
double average_tolerance(DataType dt) {
  switch (dt) {
    case DataType::kFloat16: return 2e-3;
    case DataType::kBFloat16: return 1e-2;
    case DataType::kFloat32: return 1e-6;
    default: return 1e-12;
  }
}

template <typename T>
void fill_typed(T* p, std::size_t count, ReduceOp op, int rank, int world, std::size_t first) {
  for (std::size_t i = 0; i < count; ++i) p[i] = encode<T>(input_value(first + i, op, rank, world));
}

template <typename T>
std::size_t wrong_typed(const T* p, std::size_t count, DataType dt, ReduceOp op, int world,
                        std::size_t first) {
  std::size_t wrong = 0;
  const double tol = average_tolerance(dt);
  for (std::size_t i = 0; i < count; ++i) {
    const double got = decode<T>(p[i]);
    // The expected value as the element type stores it.
    const double want = decode<T>(encode<T>(expected_value(first + i, op, world)));
    const bool ok = op == ReduceOp::kAverage ? std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want))
                                             : got == want;
    if (!ok) ++wrong;
  }
  return wrong;
}

// Calls fn(T*) with the storage type of dt.
template <typename Fn>
auto with_type(DataType dt, void* p, Fn&& fn) {
  switch (dt) {
    case DataType::kFloat32: return fn(static_cast<float*>(p));
    case DataType::kFloat64: return fn(static_cast<double*>(p));
    case DataType::kFloat16: return fn(static_cast<Half*>(p));
    case DataType::kBFloat16: return fn(static_cast<BFloat*>(p));
    case DataType::kInt8: return fn(static_cast<std::int8_t*>(p));
    case DataType::kUInt8: return fn(static_cast<std::uint8_t*>(p));
    case DataType::kInt32: return fn(static_cast<std::int32_t*>(p));
    case DataType::kInt64: return fn(static_cast<std::int64_t*>(p));
    case DataType::kInt16:
    case DataType::kBool: break;  // not offered by this benchmark
  }
  throw InvalidArgument(fmt::format("the benchmark does not run {}", dtype_name(dt)));
}

}  // namespace

std::size_t parse_size(std::string_view what, std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 15) {
    throw InvalidArgument(fmt::format("{}: '{}' is not a size (e.g. 8, 1K, 64M)", what, text));
  }
  const std::size_t v = std::stoull(std::string(text.substr(0, digits)));
  const std::string_view unit = text.substr(digits);
  unsigned shift = 0;
  if (unit == "K" || unit == "k" || unit == "KiB") shift = 10;
  else if (unit == "M" || unit == "m" || unit == "MiB") shift = 20;
  else if (unit == "G" || unit == "g" || unit == "GiB") shift = 30;
  else if (!unit.empty() && unit != "B")
    throw InvalidArgument(fmt::format("{}: '{}' has an unknown unit (use K, M or G)", what, text));
  return v << shift;
}

long parse_int(std::string_view what, std::string_view text, long min) {
  try {
    std::size_t used = 0;
    const long v = std::stol(std::string(text), &used);
    if (used == text.size() && v >= min) return v;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(fmt::format("{}: '{}' is not an integer >= {}", what, text, min));
}

DataType parse_dtype(std::string_view t) {
  if (t == "float32" || t == "float") return DataType::kFloat32;
  if (t == "float64" || t == "double") return DataType::kFloat64;
  if (t == "float16" || t == "half") return DataType::kFloat16;
  if (t == "bfloat16") return DataType::kBFloat16;
  if (t == "int8") return DataType::kInt8;
  if (t == "uint8") return DataType::kUInt8;
  if (t == "int32" || t == "int") return DataType::kInt32;
  if (t == "int64") return DataType::kInt64;
  throw InvalidArgument(fmt::format(
      "--datatype: unknown type '{}' (float32, float64, float16, bfloat16, int8, uint8, int32, int64)", t));
}

ReduceOp parse_op(std::string_view t) {
  if (t == "sum") return ReduceOp::kSum;
  if (t == "average" || t == "avg") return ReduceOp::kAverage;
  if (t == "min") return ReduceOp::kMin;
  if (t == "max") return ReduceOp::kMax;
  if (t == "prod" || t == "product") return ReduceOp::kProduct;
  throw InvalidArgument(fmt::format("--op: unknown operation '{}' (sum, average, min, max, prod)", t));
}

std::string format_size(std::size_t bytes) {
  if (bytes >= (1u << 30) && bytes % (1u << 30) == 0) return fmt::format("{}G", bytes >> 30);
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return fmt::format("{}M", bytes >> 20);
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

MPI_Datatype mpi_datatype(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kInt16:
    case DataType::kBool: return MPI_DATATYPE_NULL;
  }
  return MPI_DATATYPE_NULL;
}

void fill_input(void* buf, std::size_t count, DataType dt, ReduceOp op, int rank, int world,
                std::size_t first) {
  with_type(dt, buf, [&](auto* p) { fill_typed(p, count, op, rank, world, first); });
}

double expected_value(std::size_t i, ReduceOp op, int world) {
  const std::size_t n = static_cast<std::size_t>(world);
  const double base = static_cast<double>(i % 7);
  switch (op) {
    case ReduceOp::kSum: return static_cast<double>(n) * base + static_cast<double>(n * (n - 1) / 2);
    case ReduceOp::kAverage: return base + static_cast<double>(n - 1) / 2.0;
    case ReduceOp::kMin: return base;
    case ReduceOp::kMax: return base + static_cast<double>(n - 1);
    case ReduceOp::kProduct: {
      // Ranks r with (r + i) odd contribute a factor 2.
      const std::size_t odd = (i % 2 == 0) ? n / 2 : (n + 1) / 2;
      return std::ldexp(1.0, static_cast<int>(odd));
    }
    case ReduceOp::kAdasum: break;  // no closed form: not offered by this benchmark
  }
  return 0.0;
}

std::size_t count_wrong(const void* buf, std::size_t count, DataType dt, ReduceOp op, int world,
                        std::size_t first) {
  return with_type(dt, const_cast<void*>(buf),
                   [&](auto* p) { return wrong_typed(p, count, dt, op, world, first); });
}

void poison(void* buf, std::size_t bytes) { std::memset(buf, 0xA5, bytes); }

void mpi_allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op) {
  const MPI_Datatype mdt = mpi_datatype(dt);
  if (mdt == MPI_DATATYPE_NULL) {
    throw InvalidArgument(fmt::format("MPI has no datatype for {}", dtype_name(dt)));
  }
  if (count > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw InvalidArgument(fmt::format("MPI_Allreduce count {} exceeds INT_MAX", count));
  }
  MPI_Op mop = MPI_SUM;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: mop = MPI_SUM; break;
    case ReduceOp::kMin: mop = MPI_MIN; break;
    case ReduceOp::kMax: mop = MPI_MAX; break;
    case ReduceOp::kProduct: mop = MPI_PROD; break;
    case ReduceOp::kAdasum: throw InvalidArgument("MPI has no Adasum");
  }
  const int rc = MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, static_cast<int>(count), mdt, mop,
                               MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) throw TransportError(fmt::format("MPI_Allreduce returned {}", rc));
  if (op == ReduceOp::kAverage) {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (dt == DataType::kFloat32) {
      const float f = 1.0f / static_cast<float>(n);
      float* p = static_cast<float*>(out);
      for (std::size_t i = 0; i < count; ++i) p[i] *= f;
    } else if (dt == DataType::kFloat64) {
      const double f = 1.0 / n;
      double* p = static_cast<double*>(out);
      for (std::size_t i = 0; i < count; ++i) p[i] *= f;
    } else {
      throw InvalidArgument(fmt::format("average is not defined on {}", dtype_name(dt)));
    }
  }
}

double now_s() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) { return percentile(std::move(v), 50.0); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  // Linear interpolation between closest ranks.
  const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

std::vector<double> max_across_ranks(const std::vector<double>& v) {
  std::vector<double> out(v.size());
  MPI_Allreduce(v.data(), out.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

double algbw_gbs(std::size_t bytes, double seconds) {
  return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
}

double allreduce_busbw_gbs(std::size_t bytes, double seconds, int world) {
  return algbw_gbs(bytes, seconds) * 2.0 * (world - 1) / world;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return fmt::format("{:.6g}", v);
}

HostBuffer::HostBuffer(std::size_t bytes, bool huge_pages) {
  const std::size_t align = huge_pages ? std::size_t{2} << 20 : 4096;
  // At least one byte more than asked keeps a zero-byte buffer a valid
  // pointer; aligned_alloc wants a multiple of the alignment.
  const std::size_t size = (bytes + align) / align * align;
  p_ = static_cast<std::byte*>(std::aligned_alloc(align, size));
  if (!p_) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (huge_pages) (void)madvise(p_, size, MADV_HUGEPAGE);
#endif
  std::memset(p_, 0, size);
}

HostBuffer::~HostBuffer() { std::free(p_); }

}  // namespace gyre::bench
