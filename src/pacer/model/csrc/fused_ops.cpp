// Fused elementwise steps of a decoder layer, each one pass over its rows in float32:
//   rope_write_kv  rotate q and k in place inside the fused qkv output and store k, v in
//                  the paged cache, quantised on write for an int8 / fp8 cache (kv_quant.h)
//                  (replaces ~12 torch ops per layer)
//   silu_and_mul   silu(gate) * up from the fused gate_up output
//   add_rms_norm   x += delta, then rms_norm(x) * weight (the residual add and the next
//                  norm in one read of x)
#include "convert.h"
#include "ops.h"

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

namespace {

using pacer::from_f;
using pacer::to_f;

template <typename T, typename W>
void rope_write_kv_kernel(T* qkv, const int64_t* pos, const float* cos, const float* sin, const int64_t* slots,
                          const W kc, const W vc, int64_t n_tok, int64_t n_heads, int64_t n_kv, int64_t d) {
  const int64_t half = d / 2, width = (n_heads + 2 * n_kv) * d;
  at::parallel_for(0, n_tok, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(d);
    for (int64_t t = begin; t < end; ++t) {
      T* row = qkv + t * width;
      const float* c = cos + pos[t] * half;
      const float* s = sin + pos[t] * half;
      for (int64_t h = 0; h < n_heads + n_kv; ++h) {  // q heads, then k heads
        T* x = row + h * d;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = to_f(x[i]), x2 = to_f(x[i + half]);
          x[i] = from_f<T>(x1 * c[i] - x2 * s[i]);
          x[i + half] = from_f<T>(x2 * c[i] + x1 * s[i]);
        }
      }
      const int64_t slot = slots[t];
      if (slot < 0) continue;
      const T* k = row + n_heads * d;
      const T* v = k + n_kv * d;
      for (int64_t g = 0; g < n_kv; ++g) {  // quantised on write when the cache is int8 / fp8
        for (int64_t i = 0; i < d; ++i) buf[i] = to_f(k[g * d + i]);
        kc.store(slot, g, buf.data());
        for (int64_t i = 0; i < d; ++i) buf[i] = to_f(v[g * d + i]);
        vc.store(slot, g, buf.data());
      }
    }
  });
}

template <typename T>
void silu_and_mul_kernel(const T* gu, T* out, int64_t rows, int64_t inter) {
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gu + r * 2 * inter;
      const T* u = g + inter;
      T* o = out + r * inter;
      for (int64_t i = 0; i < inter; ++i) {
        const float gf = to_f(g[i]);
        o[i] = from_f<T>(gf / (1.f + std::exp(-gf)) * to_f(u[i]));
      }
    }
  });
}

template <typename T>
void add_rms_norm_kernel(T* x, const T* delta, const T* w, T* out, int64_t rows, int64_t hidden, float eps) {
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(hidden);
    float* __restrict__ b = buf.data();
    for (int64_t r = begin; r < end; ++r) {
      T* __restrict__ xr = x + r * hidden;
      T* __restrict__ orow = out + r * hidden;
      float ss = 0.f;
      if (delta != nullptr) {
        const T* __restrict__ dr = delta + r * hidden;
        for (int64_t i = 0; i < hidden; ++i) {
          b[i] = to_f(from_f<T>(to_f(xr[i]) + to_f(dr[i])));  // the residual keeps x's dtype
          ss += b[i] * b[i];
        }
        for (int64_t i = 0; i < hidden; ++i) xr[i] = from_f<T>(b[i]);
      } else {
        for (int64_t i = 0; i < hidden; ++i) {
          b[i] = to_f(xr[i]);
          ss += b[i] * b[i];
        }
      }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(hidden) + eps);
      for (int64_t i = 0; i < hidden; ++i) orow[i] = from_f<T>(b[i] * inv * to_f(w[i]));
    }
  });
}

}  // namespace

void rope_write_kv(torch::Tensor qkv, torch::Tensor positions, torch::Tensor cos, torch::Tensor sin,
                   torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slot_mapping, int64_t n_heads,
                   double k_scale, double v_scale) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.is_contiguous(), "qkv must be contiguous [tokens, heads + 2 kv_heads, head_dim]");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat && sin.scalar_type() == torch::kFloat && cos.is_contiguous() &&
              sin.is_contiguous(), "cos/sin must be contiguous float32 [positions, head_dim / 2]");
  TORCH_CHECK(positions.scalar_type() == torch::kLong && slot_mapping.scalar_type() == torch::kLong,
              "positions and slot_mapping must be int64");
  const int64_t n_tok = qkv.size(0), d = qkv.size(2), n_kv = (qkv.size(1) - n_heads) / 2;
  const int64_t kv_width = pacer::kv_head_width(k_cache.scalar_type(), qkv.scalar_type(), d);
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() && kv_width >= 0 &&
              v_cache.scalar_type() == k_cache.scalar_type() && v_cache.sizes() == k_cache.sizes(),
              "caches must be contiguous, of one dtype: qkv's, int8 or float8");
  TORCH_CHECK(n_kv > 0 && n_heads + 2 * n_kv == qkv.size(1) && k_cache.size(2) == n_kv &&
              k_cache.size(3) == kv_width, "qkv and cache shapes disagree");
  TORCH_CHECK(cos.size(1) * 2 == d, "cos/sin width must be head_dim / 2");
  auto p = positions.contiguous();
  auto s = slot_mapping.contiguous();
  TORCH_CHECK(p.numel() == n_tok && s.numel() == n_tok, "one position and one slot per token");
  const int64_t* pp = p.data_ptr<int64_t>();
  const int64_t* sp = s.data_ptr<int64_t>();
  const int64_t n_slots = k_cache.size(0) * k_cache.size(1);
  for (int64_t t = 0; t < n_tok; ++t) {
    TORCH_CHECK(pp[t] >= 0 && pp[t] < cos.size(0), "position ", pp[t], " outside the rope table of ", cos.size(0));
    TORCH_CHECK(sp[t] < n_slots, "slot ", sp[t], " outside the cache of ", n_slots, " slots");
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope_write_kv", [&] {
    pacer::with_kv_writers<scalar_t>(k_cache, v_cache, d, k_scale, v_scale, [&](auto kw, auto vw) {
      rope_write_kv_kernel<scalar_t>(qkv.data_ptr<scalar_t>(), p.data_ptr<int64_t>(), cos.data_ptr<float>(),
                                     sin.data_ptr<float>(), s.data_ptr<int64_t>(), kw, vw, n_tok, n_heads, n_kv, d);
    });
  });
}

torch::Tensor silu_and_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.is_contiguous() && gate_up.size(1) % 2 == 0,
              "gate_up must be contiguous [rows, 2 * intermediate]");
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = torch::empty({rows, inter}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_and_mul", [&] {
    silu_and_mul_kernel<scalar_t>(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, inter);
  });
  return out;
}

torch::Tensor add_rms_norm_(torch::Tensor x, c10::optional<torch::Tensor> delta, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be contiguous [rows, hidden]");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "weight must be [hidden] of x's dtype");
  if (delta.has_value())
    TORCH_CHECK(delta->sizes() == x.sizes() && delta->is_contiguous() && delta->scalar_type() == x.scalar_type(),
                "delta must be contiguous and match x");
  auto out = torch::empty_like(x);
  auto w = weight.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm_", [&] {
    add_rms_norm_kernel<scalar_t>(x.data_ptr<scalar_t>(), delta.has_value() ? delta->data_ptr<scalar_t>() : nullptr,
                                  w.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), x.size(0), x.size(1),
                                  static_cast<float>(eps));
  });
  return out;
}
