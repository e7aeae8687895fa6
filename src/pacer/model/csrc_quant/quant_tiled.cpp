// Entry point of the tiled int8-activation kernels (quant_tiled.h) and the activation quantizer
// they share with the one-row kernels in quant_linear.cpp.
#include <torch/extension.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "quant_tiled.h"

namespace pacer_quant {

bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool cpu_has_avx512vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

namespace {

void quantize_block_scalar(const float* v, int8_t* q, float* d_out, float* s_out, int32_t* i_out) {
  float amax = 0.f;
  for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(v[j]));
  const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
  int32_t isum = 0;
  for (int j = 0; j < QK; ++j) {
    q[j] = static_cast<int8_t>(std::nearbyint(v[j] * inv));
    isum += q[j];
  }
  *d_out = d;
  *s_out = d * static_cast<float>(isum);
  *i_out = 128 * isum;
}

// The scalar version's results exactly (the same max, reciprocal, product and round-to-nearest-even).
__attribute__((target("avx2,fma"))) void quantize_block_avx2(const float* v, int8_t* q, float* d_out, float* s_out,
                                                            int32_t* i_out) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 x[4], mx = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    x[j] = _mm256_loadu_ps(v + 8 * j);
    mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, x[j]));
  }
  alignas(32) float m8[8];
  _mm256_store_ps(m8, mx);
  float amax = 0.f;
  for (int j = 0; j < 8; ++j) amax = std::max(amax, m8[j]);
  const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
  const __m256 vi = _mm256_set1_ps(inv);
  __m256i i[4];
  for (int j = 0; j < 4; ++j) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(x[j], vi));
  const __m256i isum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
  alignas(32) int32_t is8[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(is8), isum);
  int32_t total = 0;
  for (int j = 0; j < 8; ++j) total += is8[j];
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  *d_out = d;
  *s_out = d * static_cast<float>(total);
  *i_out = 128 * total;
}

}  // namespace

void quantize_activations(const float* x, int64_t T, int64_t K, int8_t* xq, float* xd, float* xs, int32_t* xi) {
  const int64_t nb = K / QK;
  const bool simd = cpu_has_avx2();
#pragma omp parallel for schedule(static) if (T * K > 65536)
  for (int64_t i = 0; i < T * nb; ++i) {
    if (simd) quantize_block_avx2(x + i * QK, xq + i * QK, xd + i, xs + i, xi + i);
    else quantize_block_scalar(x + i * QK, xq + i * QK, xd + i, xs + i, xi + i);
  }
}

}  // namespace pacer_quant

using pacer_quant::GROUP;
using pacer_quant::QK;

torch::Tensor quant_linear_tiled(torch::Tensor x, torch::Tensor qt, torch::Tensor dt, torch::Tensor mt, int64_t bits,
                                 int64_t N, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32 [T, K]");
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  TORCH_CHECK((isa == 1 && pacer_quant::cpu_has_avx2()) || (isa == 2 && pacer_quant::cpu_has_avx512vnni()),
              "the tiled kernel runs isa 1 (avx2) or 2 (avx512vnni) where the CPU has it; got ", isa);
  const int64_t T = x.size(0), K = x.size(1), G = (N + GROUP - 1) / GROUP;
  TORCH_CHECK(K % QK == 0, "K must be a multiple of 32");
  const int64_t nb = K / QK;
  TORCH_CHECK(qt.scalar_type() == torch::kUInt8 && qt.is_contiguous() && qt.numel() == G * nb * (bits == 4 ? 256 : 512),
              "qt must be the tiled uint8 layout of a [N, K] weight");
  TORCH_CHECK(dt.scalar_type() == torch::kFloat32 && dt.is_contiguous() && dt.numel() == G * nb * GROUP,
              "dt must be float32 [ceil(N/16), K/32, 16]");
  TORCH_CHECK(bits == 8 || (mt.scalar_type() == torch::kFloat32 && mt.is_contiguous() && mt.numel() == dt.numel()),
              "mt must be float32 [ceil(N/16), K/32, 16] for 4-bit blocks");
  auto y = torch::empty({T, N}, x.options());
  std::vector<int8_t> xq(T * K);
  std::vector<float> xd(T * nb), xs(T * nb);
  std::vector<int32_t> xi(T * nb);
  pacer_quant::quantize_activations(x.data_ptr<float>(), T, K, xq.data(), xd.data(), xs.data(), xi.data());
  pacer_quant::TiledArgs a{xq.data(), xd.data(), xs.data(), xi.data(), qt.data_ptr<uint8_t>(), dt.data_ptr<float>(),
                           bits == 4 ? mt.data_ptr<float>() : nullptr, y.data_ptr<float>(), T, N, K, nb, G,
                           static_cast<int>(bits)};
  if (isa == 2) pacer_quant::run_tiled_vnni(a);
  else pacer_quant::run_tiled_avx2(a);
  return y;
}
