// See reduce_kernels_x86.h. Functions carry target("avx2,f16c") so that the
// rest of the library stays at the baseline ISA; callers dispatch on
// has_avx2_f16c(), checked once.
#include "reduce_kernels_x86.h"

#include "kernel_ops.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GYRE_HAVE_X86_KERNELS 1
#endif

namespace gyre::collectives::detail {

#ifdef GYRE_HAVE_X86_KERNELS

namespace {

using namespace kernels;
#define GYRE_AVX2 __attribute__((target("avx2,f16c")))

template <class E>
GYRE_AVX2 inline __m256 load8(const std::uint16_t* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (std::is_same_v<E, Half>) {
    return _mm256_cvtph_ps(x);  // exact, subnormals and NaN included
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
  }
}

template <class E>
GYRE_AVX2 inline void store8(std::uint16_t* p, __m256 v) {
  __m128i packed;
  if constexpr (std::is_same_v<E, Half>) {
    packed = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    // float_to_bf16 in float16.h, 8 lanes at a time.
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    // Narrow 8 x 32-bit (all <= 0xffff) to 8 x 16-bit, in order.
    const __m256i both = _mm256_packus_epi32(r, r);
    packed = _mm256_castsi256_si128(_mm256_permute4x64_epi64(both, 0x08));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// Same operand order as the scalar Op::apply(a, b) (min: b < a ? b : a),
// so that signed zeros come out the same way.
template <class Op>
GYRE_AVX2 inline __m256 apply8(__m256 a, __m256 b) {
  if constexpr (std::is_same_v<Op, OpSum>) return _mm256_add_ps(a, b);
  else if constexpr (std::is_same_v<Op, OpProd>) return _mm256_mul_ps(a, b);
  else if constexpr (std::is_same_v<Op, OpMin>) return _mm256_min_ps(b, a);  // b < a ? b : a
  else return _mm256_max_ps(b, a);                                            // a < b ? b : a
}

// out = a (+) b; out may be a or b (each block of 8 is loaded before stored).
template <class E, class Op>
GYRE_AVX2 void combine16(std::uint16_t* out, const std::uint16_t* a, const std::uint16_t* b,
                         std::size_t n) {
  using C = Codec<E>;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) store8<E>(out + i, apply8<Op>(load8<E>(a + i), load8<E>(b + i)));
  for (; i < n; ++i) out[i] = C::store(Op::apply(C::load(a[i]), C::load(b[i])));
}

template <class E>
GYRE_AVX2 void scale16(std::uint16_t* x, std::size_t n, float f) {
  using C = Codec<E>;
  const __m256 vf = _mm256_set1_ps(f);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) store8<E>(x + i, _mm256_mul_ps(load8<E>(x + i), vf));
  for (; i < n; ++i) x[i] = C::store(C::load(x[i]) * f);
}

template <class E, class Op>
void reduce_entry(void* inout, const void* in, std::size_t n) {
  auto* io = static_cast<std::uint16_t*>(inout);
  combine16<E, Op>(io, io, static_cast<const std::uint16_t*>(in), n);
}

template <class E, class Op>
void combine_entry(void* out, const void* a, const void* b, std::size_t n) {
  combine16<E, Op>(static_cast<std::uint16_t*>(out), static_cast<const std::uint16_t*>(a),
                   static_cast<const std::uint16_t*>(b), n);
}

template <class E>
void pick(ReduceOp op, ReduceFn* r, CombineFn* c) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: *r = reduce_entry<E, OpSum>; *c = combine_entry<E, OpSum>; return;
    case ReduceOp::kMin: *r = reduce_entry<E, OpMin>; *c = combine_entry<E, OpMin>; return;
    case ReduceOp::kMax: *r = reduce_entry<E, OpMax>; *c = combine_entry<E, OpMax>; return;
    case ReduceOp::kProduct: *r = reduce_entry<E, OpProd>; *c = combine_entry<E, OpProd>; return;
    case ReduceOp::kAdasum: return;  // not element-wise
  }
}

void lookup(DataType dt, ReduceOp op, ReduceFn* r, CombineFn* c) {
  *r = nullptr;
  *c = nullptr;
  if (!has_avx2_f16c()) return;
  if (dt == DataType::kFloat16) pick<Half>(op, r, c);
  if (dt == DataType::kBFloat16) pick<BFloat>(op, r, c);
}

}  // namespace

bool has_avx2_f16c() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}

ReduceFn reduce_kernel_avx2(DataType dt, ReduceOp op) {
  ReduceFn r;
  CombineFn c;
  lookup(dt, op, &r, &c);
  return r;
}

CombineFn combine_kernel_avx2(DataType dt, ReduceOp op) {
  ReduceFn r;
  CombineFn c;
  lookup(dt, op, &r, &c);
  return c;
}

bool scale_avx2(void* buf, std::size_t count, DataType dt, float factor) {
  if (!has_avx2_f16c()) return false;
  if (dt == DataType::kFloat16) scale16<Half>(static_cast<std::uint16_t*>(buf), count, factor);
  else if (dt == DataType::kBFloat16) scale16<BFloat>(static_cast<std::uint16_t*>(buf), count, factor);
  else return false;
  return true;
}

#else  // not x86-64 with GNU extensions: the portable loops serve alone

bool has_avx2_f16c() { return false; }
ReduceFn reduce_kernel_avx2(DataType, ReduceOp) { return nullptr; }
CombineFn combine_kernel_avx2(DataType, ReduceOp) { return nullptr; }
bool scale_avx2(void*, std::size_t, DataType, float) { return false; }

#endif

}  // namespace gyre::collectives::detail
