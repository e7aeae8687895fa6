// Many-row quantized linear with int8 activations: the tiled layout and its kernels.
//
// Tiled layout (built once at load by pacer/model/quant.py `tile_weight`): rows in groups of 16,
// and within a group and block of 32, the values k = 4j..4j+3 of the 16 rows side by side, so one
// 64-byte vector holds 4 consecutive values of each of 16 rows (what dpbusd/maddubs sum into one
// 32-bit lane per row) and a broadcast of 4 activation bytes multiplies all 16 rows at once:
//   bits=4: qt uint8 [G, nb, 4, 16, 4], byte = q[4j + c] | q[4(j + 4) + c] << 4 (j = 0..3)
//   bits=8: qt uint8 [G, nb, 8, 16, 4], byte = q[4j + c] + 128 (q signed; the kernel subtracts
//           128 * sum(x) per block, so the integer sums are the signed products' exactly)
//   dt, mt float32 [G, nb, 16] (mt: the 4-bit offset m; unused for bits=8); G = ceil(N / 16),
//   rows past N are zero.
// A weight block is unpacked once per tile of tokens, an activation block is read once per group
// of 16 rows, and the per-block scales are applied to 16 rows with one vector multiply.
#pragma once

#include <cstdint>

namespace pacer_quant {

constexpr int QK = 32;
constexpr int GROUP = 16;

struct TiledArgs {
  const int8_t* xq;      // [T, K] activations per block of 32: int8 ...
  const float* xd;       // [T, nb] ... with scale xd
  const float* xs;       // [T, nb] xd * the sum of the block's int8 activations (bits=4: the m term)
  const int32_t* xi;     // [T, nb] 128 * the sum of the block's int8 activations (bits=8)
  const uint8_t* qt;
  const float* dt;
  const float* mt;
  float* y;              // [T, N]
  int64_t T, N, K, nb, G;
  int bits;
};

// Per token and block of 32: int8 values (scale max|x| / 127, round to nearest even) and their sum.
// The 4-bit offset term is m * xd * sum(int8), not m * sum(x): with the sum of the quantized values
// the block's error is sum((d q + m) e) over the rounding errors e, weighted by the centred w
// (Q4_1's m is about -8d), where the exact sum would leave d * sum(q e) with q in 0..15 all of one
// sign, about 3.7x the error variance (measured: KL 1.9e-2 against 2.7e-3 on the default model).
void quantize_activations(const float* x, int64_t T, int64_t K, int8_t* xq, float* xd, float* xs, int32_t* xi);

void run_tiled_vnni(const TiledArgs& a);
void run_tiled_avx2(const TiledArgs& a);
bool cpu_has_avx2();
bool cpu_has_avx512vnni();

}  // namespace pacer_quant
