// Weight-only quantized linear over GGUF-style blocks of 32 weights, kept packed.
//
// Layout (repacked once at load, see pacer/model/quant.py):
//   bits=4: qs uint8 [N, K/32, 16], nibble q in [0, 15]; low nibbles are elements 0..15 of the
//           block, high nibbles 16..31 (GGUF's own order); w = d * q + m   (Q4_1; Q4_0 has m = -8d)
//   bits=8: qs int8  [N, K/32, 32];                                     w = d * q   (Q8_0, int8)
//   d, m float32 [N, K/32] (m empty for bits=8).
// act=0 (float activations): each output row is dequantized into a thread-local buffer and dotted
//   with every token; the result is the dequantized float32 path's up to summation order.
// act=1 (int8 activations): each token is quantized per block of 32 to int8 with a float scale, and
//   blocks are integer dot products, as llama.cpp does. Here the scalar reference only; the SIMD
//   paths (AVX2 maddubs, AVX-512 VNNI dpbusd) run over the tiled layout (quant_tiled.h).
// Compiled without -march: each ISA variant carries its own target attribute and the path is picked
// at run time from the CPU's features (or forced by the caller).
#include <torch/extension.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "quant_tiled.h"

torch::Tensor quant_linear_tiled(torch::Tensor x, torch::Tensor qt, torch::Tensor dt, torch::Tensor mt, int64_t bits,
                                 int64_t N, int64_t isa);

namespace {

using pacer_quant::QK;
enum Isa { SCALAR = 0, AVX2 = 1, AVX512VNNI = 2 };

bool has_avx2() { return pacer_quant::cpu_has_avx2(); }
bool has_avx512vnni() { return pacer_quant::cpu_has_avx512vnni(); }
bool supported(int isa) { return isa == SCALAR || (isa == AVX2 && has_avx2()) || (isa == AVX512VNNI && has_avx512vnni()); }

struct Args {
  const float* x;        // [T, K] (act=0)
  const int8_t* xq;      // [T, K] (act=1)
  const float* xd;       // [T, nb] per-block activation scales (act=1)
  const float* xs;       // [T, nb] per-block xd * sum of the int8 activations (act=1, bits=4)
  const uint8_t* qs;
  const float* d;
  const float* m;
  float* y;              // [T, N]
  int64_t T, N, K, nb;
  int bits;
};

// ------------------------------------------------------------------ scalar

void dequant_row_scalar(const Args& a, int64_t n, float* w) {
  for (int64_t b = 0; b < a.nb; ++b) {
    const float d = a.d[n * a.nb + b];
    float* o = w + b * QK;
    if (a.bits == 4) {
      const uint8_t* q = a.qs + (n * a.nb + b) * 16;
      const float m = a.m[n * a.nb + b];
      for (int i = 0; i < 16; ++i) {
        o[i] = d * static_cast<float>(q[i] & 15) + m;
        o[i + 16] = d * static_cast<float>(q[i] >> 4) + m;
      }
    } else {
      const int8_t* q = reinterpret_cast<const int8_t*>(a.qs) + (n * a.nb + b) * QK;
      for (int i = 0; i < QK; ++i) o[i] = d * static_cast<float>(q[i]);
    }
  }
}

float dot_scalar(const float* w, const float* x, int64_t K) {
  float s = 0.f;
  for (int64_t k = 0; k < K; ++k) s += w[k] * x[k];
  return s;
}

float row_int8_scalar(const Args& a, int64_t n, int64_t t) {
  float acc = 0.f;
  for (int64_t b = 0; b < a.nb; ++b) {
    const int8_t* x = a.xq + t * a.K + b * QK;
    int32_t s = 0;
    if (a.bits == 4) {
      const uint8_t* q = a.qs + (n * a.nb + b) * 16;
      for (int i = 0; i < 16; ++i) s += (q[i] & 15) * x[i] + (q[i] >> 4) * x[i + 16];
      acc += a.d[n * a.nb + b] * a.xd[t * a.nb + b] * static_cast<float>(s) + a.m[n * a.nb + b] * a.xs[t * a.nb + b];
    } else {
      const int8_t* q = reinterpret_cast<const int8_t*>(a.qs) + (n * a.nb + b) * QK;
      for (int i = 0; i < QK; ++i) s += q[i] * x[i];
      acc += a.d[n * a.nb + b] * a.xd[t * a.nb + b] * static_cast<float>(s);
    }
  }
  return acc;
}

// ------------------------------------------------------------------ AVX2

__attribute__((target("avx2,fma"))) inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 32 weights of block b of row n as u8 (bits=4, nibbles in element order) or i8 (bits=8).
__attribute__((target("avx2,fma"))) inline __m256i load_block(const Args& a, int64_t n, int64_t b) {
  if (a.bits == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.qs + (n * a.nb + b) * 16));
    const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(15));
    return _mm256_set_m128i(hi, lo);
  }
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs + (n * a.nb + b) * QK));
}

__attribute__((target("avx2,fma"))) void dequant_row_avx2(const Args& a, int64_t n, float* w) {
  for (int64_t b = 0; b < a.nb; ++b) {
    const __m256i q = load_block(a, n, b);
    const __m256 d = _mm256_set1_ps(a.d[n * a.nb + b]);
    const __m256 m = a.bits == 4 ? _mm256_set1_ps(a.m[n * a.nb + b]) : _mm256_setzero_ps();
    const __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1);
    const __m128i parts[4] = {q0, _mm_srli_si128(q0, 8), q1, _mm_srli_si128(q1, 8)};
    for (int j = 0; j < 4; ++j) {
      const __m256i i32 = a.bits == 4 ? _mm256_cvtepu8_epi32(parts[j]) : _mm256_cvtepi8_epi32(parts[j]);
      _mm256_storeu_ps(w + b * QK + 8 * j, _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(i32), m));
    }
  }
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* w, const float* x, int64_t K) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), s3);
  }
  return hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

// ------------------------------------------------------------------ drivers

void run_float(const Args& a, int isa) {
#pragma omp parallel
  {
    std::vector<float> w(a.K);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < a.N; ++n) {
      if (isa == SCALAR) {
        dequant_row_scalar(a, n, w.data());
        for (int64_t t = 0; t < a.T; ++t) a.y[t * a.N + n] = dot_scalar(w.data(), a.x + t * a.K, a.K);
      } else {
        dequant_row_avx2(a, n, w.data());
        for (int64_t t = 0; t < a.T; ++t) a.y[t * a.N + n] = dot_avx2(w.data(), a.x + t * a.K, a.K);
      }
    }
  }
}

void run_int8_scalar(const Args& a) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < a.N; ++n)
    for (int64_t t = 0; t < a.T; ++t) a.y[t * a.N + n] = row_int8_scalar(a, n, t);
}

int best_isa() { return has_avx512vnni() ? AVX512VNNI : has_avx2() ? AVX2 : SCALAR; }

std::vector<std::string> cpu_isas() {
  std::vector<std::string> out{"scalar"};
  if (has_avx2()) out.push_back("avx2");
  if (has_avx512vnni()) out.push_back("avx512vnni");
  return out;
}

torch::Tensor quant_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m, int64_t bits,
                           int64_t act, int64_t isa) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32 [T, K]");
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  TORCH_CHECK(act == 0 || act == 1, "act must be 0 (float) or 1 (int8)");
  TORCH_CHECK(act == 0 || isa == SCALAR, "int8 activations run here on the scalar path only (SIMD: quant_linear_tiled)");
  TORCH_CHECK(isa >= 0 && isa <= 2 && supported(static_cast<int>(isa)), "isa ", isa, " is not supported on this CPU");
  const int64_t T = x.size(0), K = x.size(1), N = qs.size(0);
  TORCH_CHECK(K % QK == 0, "K must be a multiple of 32");
  const int64_t nb = K / QK;
  TORCH_CHECK(qs.scalar_type() == torch::kUInt8 && qs.is_contiguous() && qs.numel() == N * nb * (bits == 4 ? 16 : 32),
              "qs must be contiguous uint8 [N, K/32, 16 or 32]");
  TORCH_CHECK(d.scalar_type() == torch::kFloat32 && d.is_contiguous() && d.numel() == N * nb, "d must be float32 [N, K/32]");
  TORCH_CHECK(bits == 8 || (m.scalar_type() == torch::kFloat32 && m.is_contiguous() && m.numel() == N * nb),
              "m must be float32 [N, K/32] for 4-bit blocks");
  auto y = torch::empty({T, N}, x.options());
  Args a{x.data_ptr<float>(), nullptr, nullptr, nullptr, qs.data_ptr<uint8_t>(), d.data_ptr<float>(),
         bits == 4 ? m.data_ptr<float>() : nullptr, y.data_ptr<float>(), T, N, K, nb, static_cast<int>(bits)};
  if (act == 0) {
    run_float(a, isa == SCALAR ? SCALAR : AVX2);
    return y;
  }
  std::vector<int8_t> xq(T * K);
  std::vector<float> xd(T * nb), xs(T * nb);
  std::vector<int32_t> xi(T * nb);
  pacer_quant::quantize_activations(a.x, T, K, xq.data(), xd.data(), xs.data(), xi.data());
  a.xq = xq.data();
  a.xd = xd.data();
  a.xs = xs.data();
  run_int8_scalar(a);
  return y;
}

void check_packed(const torch::Tensor& qs, const torch::Tensor& d, const torch::Tensor& m, int64_t bits, int64_t isa) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  TORCH_CHECK(isa >= 0 && isa <= 2 && supported(static_cast<int>(isa)), "isa ", isa, " is not supported on this CPU");
  TORCH_CHECK(qs.scalar_type() == torch::kUInt8 && qs.is_contiguous() && qs.dim() == 3 && qs.size(2) == (bits == 4 ? 16 : 32),
              "qs must be contiguous uint8 [N, K/32, 16 or 32]");
  TORCH_CHECK(d.scalar_type() == torch::kFloat32 && d.is_contiguous() && d.numel() == qs.size(0) * qs.size(1), "d must be float32 [N, K/32]");
  TORCH_CHECK(bits == 8 || (m.scalar_type() == torch::kFloat32 && m.is_contiguous() && m.numel() == d.numel()), "m must be float32 [N, K/32]");
}

// Rows [n0, n0 + rows) of the float32 weight into out [rows, K].
void dequant_rows(const torch::Tensor& qs, const torch::Tensor& d, const torch::Tensor& m, int64_t bits, int64_t isa,
                  int64_t n0, int64_t rows, float* out) {
  const int64_t N = qs.size(0), nb = qs.size(1), K = nb * QK;
  Args a{nullptr, nullptr, nullptr, nullptr, qs.data_ptr<uint8_t>(), d.data_ptr<float>(),
         bits == 4 ? m.data_ptr<float>() : nullptr, nullptr, 0, N, K, nb, static_cast<int>(bits)};
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    if (isa == SCALAR) dequant_row_scalar(a, n0 + i, out + i * K);
    else dequant_row_avx2(a, n0 + i, out + i * K);
  }
}

}  // namespace

torch::Tensor quant_dequantize(torch::Tensor qs, torch::Tensor d, torch::Tensor m, int64_t bits, int64_t isa) {
  check_packed(qs, d, m, bits, isa);
  auto w = torch::empty({qs.size(0), qs.size(1) * QK}, d.options());
  dequant_rows(qs, d, m, bits, isa, 0, qs.size(0), w.data_ptr<float>());
  return w;
}

// Float activations, many tokens: dequantize `panel` rows at a time into a buffer that stays in
// cache and multiply it by BLAS into rows of y^T, so the float32 weight is never written whole.
torch::Tensor quant_linear_panel(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m, int64_t bits,
                                 int64_t isa, int64_t panel) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32 [T, K]");
  check_packed(qs, d, m, bits, isa);
  TORCH_CHECK(x.size(1) == qs.size(1) * QK, "x has ", x.size(1), " features, the weight ", qs.size(1) * QK);
  TORCH_CHECK(panel > 0, "panel must be positive");
  const int64_t N = qs.size(0), K = x.size(1);
  auto yt = torch::empty({N, x.size(0)}, x.options());
  auto w = torch::empty({std::min(panel, N), K}, x.options());
  const auto xt = x.t();
  for (int64_t n0 = 0; n0 < N; n0 += panel) {
    const int64_t rows = std::min(panel, N - n0);
    dequant_rows(qs, d, m, bits, isa, n0, rows, w.data_ptr<float>());
    auto out = yt.narrow(0, n0, rows);
    at::mm_out(out, w.narrow(0, 0, rows), xt);
  }
  return yt.t().contiguous();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("quant_dequantize", &quant_dequantize, "the float32 [N, K] weight of packed 4/8-bit blocks");
  mod.def("quant_linear", &quant_linear, "y = x @ dequant(W).T over packed 4/8-bit blocks of 32");
  mod.def("quant_linear_tiled", &quant_linear_tiled, "y = x @ dequant(W).T, int8 activations, tiled layout");
  mod.def("quant_linear_panel", &quant_linear_panel, "y = x @ dequant(W).T, float activations, panels of rows and BLAS");
  mod.def("best_isa", &best_isa, "the fastest path this CPU runs: 0 scalar, 1 avx2, 2 avx512vnni");
  mod.def("cpu_isas", &cpu_isas, "the paths this CPU can run");
}
