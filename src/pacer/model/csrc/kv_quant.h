// KV cache storage formats (kv_cache_dtype): what the attention kernels read and
// rope_write_kv writes. A reader turns one (slot, kv head) of a cache into head_dim floats in
// registers or a small tile buffer, so no full-precision copy of the cache is ever made.
//
//   PlainKV<T>      the model's dtype: [blocks, block_size, kv_heads, head_dim] of T
//   Int8KV          int8 values followed by a float16 scale per (token, kv head):
//                   [blocks, block_size, kv_heads, head_dim + 2] bytes, x = int8 * scale,
//                   scale = max|x| / 127 (rounded to float16 before quantising)
//   Fp8KV<E4M3>     float8 e4m3fn (E4M3) or e5m2 values, x = f8 * scale with one float32 scale
//                   per cache tensor (per layer, K and V apart)
//
// The torch reference (kv_quant.py) does the same arithmetic: the same float16 scale, the
// multiply by its float32 reciprocal, round-half-even, the same clamps.
#pragma once
#include "convert.h"
#include "simd.h"

#include <torch/extension.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace pacer {

template <typename T>
struct PlainKV {
  const T* base;
  int64_t n_kv, d;
  int64_t head_bytes() const { return d * static_cast<int64_t>(sizeof(T)); }
  const char* head_ptr(int64_t slot, int64_t head) const {
    return reinterpret_cast<const char*>(base + (slot * n_kv + head) * d);
  }
  void load(int64_t slot, int64_t head, float* dst) const {
    const T* src = base + (slot * n_kv + head) * d;
#if defined(__AVX512F__)
    if (d % 16 == 0) {
      for (int64_t i = 0; i < d; i += 16) _mm512_storeu_ps(dst + i, load16(src + i));
      return;
    }
#endif
    for (int64_t i = 0; i < d; ++i) dst[i] = to_f(src[i]);
  }
};

inline float half_at(const char* p) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

struct Int8KV {
  const char* base;
  int64_t n_kv, d;
  int64_t head_bytes() const { return d + 2; }
  const char* head_ptr(int64_t slot, int64_t head) const { return base + (slot * n_kv + head) * (d + 2); }
  void load(int64_t slot, int64_t head, float* dst) const {
    const char* p = head_ptr(slot, head);
    const float s = half_at(p + d);
    const int8_t* x = reinterpret_cast<const int8_t*>(p);
#if defined(__AVX512F__)
    if (d % 16 == 0) {
      const __m512 sv = _mm512_set1_ps(s);
      for (int64_t i = 0; i < d; i += 16) {
        const __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtepi32_ps(w), sv));
      }
      return;
    }
#endif
    for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<float>(x[i]) * s;
  }
};

template <bool E4M3>
struct Fp8KV {
  const uint8_t* base;
  int64_t n_kv, d;
  float scale;
  int64_t head_bytes() const { return d; }
  const char* head_ptr(int64_t slot, int64_t head) const {
    return reinterpret_cast<const char*>(base + (slot * n_kv + head) * d);
  }
  static float to_float(uint8_t b) {
    if constexpr (E4M3) return static_cast<float>(c10::Float8_e4m3fn(b, c10::Float8_e4m3fn::from_bits()));
    else return static_cast<float>(c10::Float8_e5m2(b, c10::Float8_e5m2::from_bits()));
  }
  void load(int64_t slot, int64_t head, float* dst) const {
    const uint8_t* x = base + (slot * n_kv + head) * d;
#if defined(__AVX512F__)
    if (d % 16 == 0) {
      // e5m2 is the top byte of a float16; e4m3 (bias 7) placed in a float16's exponent and
      // mantissa bits reads as x / 2^8, subnormals included, so one multiply restores it
      const __m512 sv = _mm512_set1_ps(E4M3 ? scale * 256.f : scale);
      for (int64_t i = 0; i < d; i += 16) {
        const __m256i u = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
        __m256i h;
        if constexpr (E4M3)
          h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(u, _mm256_set1_epi16(0x80)), 8),
                              _mm256_slli_epi16(_mm256_and_si256(u, _mm256_set1_epi16(0x7F)), 7));
        else
          h = _mm256_slli_epi16(u, 8);
        _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_cvtph_ps(h), sv));
      }
      return;
    }
#endif
    for (int64_t i = 0; i < d; ++i) dst[i] = to_float(x[i]) * scale;
  }
};

// Writers: store head_dim floats (already rounded to the model's dtype) into one (slot, head).
template <typename T>
struct PlainKVWriter {
  T* base;
  int64_t n_kv, d;
  void store(int64_t slot, int64_t head, const float* x) const {
    T* dst = base + (slot * n_kv + head) * d;
    for (int64_t i = 0; i < d; ++i) dst[i] = from_f<T>(x[i]);
  }
};

struct Int8KVWriter {
  char* base;
  int64_t n_kv, d;
  void store(int64_t slot, int64_t head, const float* x) const {
    char* p = base + (slot * n_kv + head) * (d + 2);
    float amax = 0.f;
    for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(x[i]));
    const c10::Half sh(amax * (1.f / 127.f));  // as kv_quant.py: times the float32 1/127
    const float s = static_cast<float>(sh);
    const float inv = s > 0.f ? 1.f / s : 0.f;
    int8_t* q = reinterpret_cast<int8_t*>(p);
    for (int64_t i = 0; i < d; ++i)
      q[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(x[i] * inv))));
    std::memcpy(p + d, &sh.x, sizeof sh.x);
  }
};

template <bool E4M3>
struct Fp8KVWriter {
  uint8_t* base;
  int64_t n_kv, d;
  float inv_scale;
  void store(int64_t slot, int64_t head, const float* x) const {
    uint8_t* dst = base + (slot * n_kv + head) * d;
    constexpr float lim = E4M3 ? 448.f : 57344.f;
    for (int64_t i = 0; i < d; ++i) {
      const float v = std::min(lim, std::max(-lim, x[i] * inv_scale));
      if constexpr (E4M3) dst[i] = c10::Float8_e4m3fn(v).x;
      else dst[i] = c10::Float8_e5m2(v).x;
    }
  }
};

// The last dimension a cache of this dtype has for head_dim d, or -1 for a dtype that is not
// a KV format of a model whose activations are `act`.
inline int64_t kv_head_width(c10::ScalarType cache, c10::ScalarType act, int64_t d) {
  if (cache == act) return d;
  if (cache == torch::kChar) return d + 2;
  if (cache == torch::kFloat8_e4m3fn || cache == torch::kFloat8_e5m2) return d;
  return -1;
}

// Calls f(k_reader, v_reader) for the caches' format; T is the model's activation dtype.
template <typename T, typename F>
void with_kv_readers(const torch::Tensor& kc, const torch::Tensor& vc, int64_t d, double k_scale, double v_scale,
                     F&& f) {
  const int64_t n_kv = kc.size(2);
  switch (kc.scalar_type()) {
    case torch::kChar:
      f(Int8KV{static_cast<const char*>(kc.data_ptr()), n_kv, d}, Int8KV{static_cast<const char*>(vc.data_ptr()), n_kv, d});
      return;
    case torch::kFloat8_e4m3fn:
      f(Fp8KV<true>{static_cast<const uint8_t*>(kc.data_ptr()), n_kv, d, static_cast<float>(k_scale)},
        Fp8KV<true>{static_cast<const uint8_t*>(vc.data_ptr()), n_kv, d, static_cast<float>(v_scale)});
      return;
    case torch::kFloat8_e5m2:
      f(Fp8KV<false>{static_cast<const uint8_t*>(kc.data_ptr()), n_kv, d, static_cast<float>(k_scale)},
        Fp8KV<false>{static_cast<const uint8_t*>(vc.data_ptr()), n_kv, d, static_cast<float>(v_scale)});
      return;
    default:
      f(PlainKV<T>{kc.data_ptr<T>(), n_kv, d}, PlainKV<T>{vc.data_ptr<T>(), n_kv, d});
  }
}

template <typename T, typename F>
void with_kv_writers(torch::Tensor& kc, torch::Tensor& vc, int64_t d, double k_scale, double v_scale, F&& f) {
  const int64_t n_kv = kc.size(2);
  const float ik = static_cast<float>(1.0 / k_scale), iv = static_cast<float>(1.0 / v_scale);
  switch (kc.scalar_type()) {
    case torch::kChar:
      f(Int8KVWriter{static_cast<char*>(kc.data_ptr()), n_kv, d}, Int8KVWriter{static_cast<char*>(vc.data_ptr()), n_kv, d});
      return;
    case torch::kFloat8_e4m3fn:
      f(Fp8KVWriter<true>{static_cast<uint8_t*>(kc.data_ptr()), n_kv, d, ik},
        Fp8KVWriter<true>{static_cast<uint8_t*>(vc.data_ptr()), n_kv, d, iv});
      return;
    case torch::kFloat8_e5m2:
      f(Fp8KVWriter<false>{static_cast<uint8_t*>(kc.data_ptr()), n_kv, d, ik},
        Fp8KVWriter<false>{static_cast<uint8_t*>(vc.data_ptr()), n_kv, d, iv});
      return;
    default:
      f(PlainKVWriter<T>{kc.data_ptr<T>(), n_kv, d}, PlainKVWriter<T>{vc.data_ptr<T>(), n_kv, d});
  }
}

}  // namespace pacer
