// AVX2 kernel over the tiled layout (quant_tiled.h): 8 rows per 256-bit vector (half a group),
// up to 4 tokens per tile (16 vector registers). 4-bit blocks: maddubs of the unsigned nibbles
// and the signed activations, 8 of them summed in 16 bits (|sum| <= 8 * 2 * 15 * 127 < 2^15)
// before one madd; 8-bit blocks: the sign trick (|q| times x carrying q's sign) per 4 values.
#include <immintrin.h>

#include <algorithm>

#include "quant_tiled.h"

namespace pacer_quant {
namespace {

#define PACER_AVX2 __attribute__((target("avx2,fma")))

constexpr int TILE_T = 4;

template <int BITS>
PACER_AVX2 inline void load_half_block(const uint8_t* p, __m256i* w) {
  if constexpr (BITS == 4) {
    const __m256i mask = _mm256_set1_epi8(15);
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * j));
      w[j] = _mm256_and_si256(v, mask);
      w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    }
  } else {   // stored q + 128: back to signed q
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int j = 0; j < 8; ++j)
      w[j] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * j)), flip);
  }
}

template <int BITS>
PACER_AVX2 inline __m256i block_dot(const __m256i* w, const int32_t* xb) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (BITS == 4) {
    __m256i s16 = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(xb[0]));
#pragma GCC unroll 8
    for (int j = 1; j < 8; ++j) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[j], _mm256_set1_epi32(xb[j])));
    return _mm256_madd_epi16(s16, ones);
  } else {
    __m256i s32 = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m256i x = _mm256_sign_epi8(_mm256_set1_epi32(xb[j]), w[j]);
      s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w[j]), x), ones));
    }
    return s32;
  }
}

// Rows g*16 + 8*half .. +7 for tokens t0 .. t0+TT-1.
template <int BITS, int TT>
PACER_AVX2 void tile(const TiledArgs& a, int64_t g, int half, int64_t t0) {
  constexpr int BYTES = BITS == 4 ? 256 : 512;
  __m256 acc[TT];
  for (int t = 0; t < TT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const int64_t gb = g * a.nb + b;
    __m256i w[8];
    load_half_block<BITS>(a.qt + gb * BYTES + 32 * half, w);
    const __m256 dw = _mm256_loadu_ps(a.dt + gb * GROUP + 8 * half);
    const __m256 mw = BITS == 4 ? _mm256_loadu_ps(a.mt + gb * GROUP + 8 * half) : _mm256_setzero_ps();
#pragma GCC unroll 4
    for (int t = 0; t < TT; ++t) {
      const int64_t tb = (t0 + t) * a.nb + b;
      const __m256i s = block_dot<BITS>(w, reinterpret_cast<const int32_t*>(a.xq + tb * QK));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, _mm256_set1_ps(a.xd[tb])), acc[t]);
      if constexpr (BITS == 4) acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.xs[tb]), acc[t]);
    }
  }
  const int64_t row0 = g * GROUP + 8 * half, rows = std::min<int64_t>(8, a.N - row0);
  for (int t = 0; t < TT; ++t) {
    float* out = a.y + (t0 + t) * a.N + row0;
    if (rows == 8) {
      _mm256_storeu_ps(out, acc[t]);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, acc[t]);
      std::copy(tmp, tmp + rows, out);
    }
  }
}

template <int BITS>
PACER_AVX2 void half_group(const TiledArgs& a, int64_t g, int half) {
  int64_t t = 0;
  for (; t + TILE_T <= a.T; t += TILE_T) tile<BITS, TILE_T>(a, g, half, t);
  switch (a.T - t) {
    case 3: tile<BITS, 3>(a, g, half, t); break;
    case 2: tile<BITS, 2>(a, g, half, t); break;
    case 1: tile<BITS, 1>(a, g, half, t); break;
    default: break;
  }
}

}  // namespace

void run_tiled_avx2(const TiledArgs& a) {
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < 2 * a.G; ++h) {
    if (h % 2 == 1 && (h / 2) * GROUP + 8 >= a.N) continue;   // the second half lies past N
    if (a.bits == 4) half_group<4>(a, h / 2, static_cast<int>(h % 2));
    else half_group<8>(a, h / 2, static_cast<int>(h % 2));
  }
}

}  // namespace pacer_quant
