// AVX-512 VNNI kernel over the tiled layout (quant_tiled.h): 16 rows per 512-bit vector, up to
// 8 tokens per tile; each block is 8 dpbusd per token with the 4 activation bytes broadcast.
#include <immintrin.h>

#include <algorithm>

#include "quant_tiled.h"

namespace pacer_quant {
namespace {

#define PACER_VNNI512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))

constexpr int TILE_T = 8;

template <int BITS>
PACER_VNNI512 inline void load_block(const uint8_t* p, __m512i* w) {
  if constexpr (BITS == 4) {
    const __m512i mask = _mm512_set1_epi8(15);
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(p + 64 * j);
      w[j] = _mm512_and_si512(v, mask);
      w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
  } else {
    for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(p + 64 * j);
  }
}

// Rows g*16 .. g*16+15 for tokens t0 .. t0+TT-1.
template <int BITS, int TT>
PACER_VNNI512 void tile(const TiledArgs& a, int64_t g, int64_t t0) {
  constexpr int BYTES = BITS == 4 ? 256 : 512;
  __m512 acc[TT];
  for (int t = 0; t < TT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const int64_t gb = g * a.nb + b;
    __m512i w[8];
    load_block<BITS>(a.qt + gb * BYTES, w);
    const __m512 dw = _mm512_loadu_ps(a.dt + gb * GROUP);
    const __m512 mw = BITS == 4 ? _mm512_loadu_ps(a.mt + gb * GROUP) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) {
      const int64_t tb = (t0 + t) * a.nb + b;
      const int32_t* xb = reinterpret_cast<const int32_t*>(a.xq + tb * QK);
      __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], _mm512_set1_epi32(xb[0]));
#pragma GCC unroll 8
      for (int j = 1; j < 8; ++j) s = _mm512_dpbusd_epi32(s, w[j], _mm512_set1_epi32(xb[j]));
      if constexpr (BITS == 8) s = _mm512_sub_epi32(s, _mm512_set1_epi32(a.xi[tb]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(a.xd[tb])), acc[t]);
      if constexpr (BITS == 4) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.xs[tb]), acc[t]);
    }
  }
  const int64_t rows = std::min<int64_t>(GROUP, a.N - g * GROUP);
  const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
  for (int t = 0; t < TT; ++t) _mm512_mask_storeu_ps(a.y + (t0 + t) * a.N + g * GROUP, keep, acc[t]);
}

template <int BITS>
PACER_VNNI512 void group(const TiledArgs& a, int64_t g) {
  int64_t t = 0;
  for (; t + TILE_T <= a.T; t += TILE_T) tile<BITS, TILE_T>(a, g, t);
  switch (a.T - t) {
    case 7: tile<BITS, 7>(a, g, t); break;
    case 6: tile<BITS, 6>(a, g, t); break;
    case 5: tile<BITS, 5>(a, g, t); break;
    case 4: tile<BITS, 4>(a, g, t); break;
    case 3: tile<BITS, 3>(a, g, t); break;
    case 2: tile<BITS, 2>(a, g, t); break;
    case 1: tile<BITS, 1>(a, g, t); break;
    default: break;
  }
}

}  // namespace

void run_tiled_vnni(const TiledArgs& a) {
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < a.G; ++g) {
    if (a.bits == 4) group<4>(a, g);
    else group<8>(a, g);
  }
}

}  // namespace pacer_quant
