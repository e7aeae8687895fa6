// Paged attention for single-token query rows (decode), read straight from the block
// tables: no gather copy of the context. The query heads of a GQA group share each
// key/value read. Softmax in float32, two-pass (all scores, then one exp per score).
//
// With AVX-512 or AVX2 and head_dim 64 or 128, a task is one part of at most DECODE_PART
// tokens of one request's context (all its kv heads, or one kv head when there are too few
// parts to keep every thread busy), pulled from a shared counter: a long context is split
// across the threads (flash-decoding), so a few long requests no longer leave a thread idle.
// Each part keeps its own softmax max and sum; `combine_parts` rescales and adds them. Keys go
// 16 (AVX2: 8) at a time: that many vectors of per-lane partial dot products are folded into
// one vector of scores (reduce16 / reduce8), and values are accumulated in registers.
// Otherwise a portable loop with one task per request; it alone runs a sliding window (Gemma's
// head_dim 256 takes it anyway): keys from ctx - window on.
// A quantized cache (kv_cache_dtype int8 / fp8, kv_quant.h) is dequantised row by row into
// the float tile (or the portable loop's row buffer) as it is read.
#include "convert.h"
#include "decode_plan.h"
#include "ops.h"
#include "simd.h"

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using pacer::from_f;
using pacer::to_f;
using pacer::DECODE_PART;
using pacer::DecodePlan;
using pacer::DecodeTask;
using pacer::combine_parts;
using pacer::finish_task;
using pacer::plan_decode;

template <typename T, typename KV>
void decode_kernel(const T* q, int64_t q_stride, const KV kc, const KV vc, const int64_t* tables,
                   const int64_t* ctx_lens, T* out, int64_t out_stride, int64_t num_rows, int64_t n_heads,
                   int64_t n_kv, int64_t d, int64_t bs, int64_t max_blocks, float scale, int64_t window) {
  // One task per row. Keys are read token by token in cache order (all kv heads of a slot
  // are contiguous), so each block is streamed from memory once; then one vectorisable exp
  // over each head's scores; then the weighted sum of values in the same order.
  const int64_t group = n_heads / n_kv;
  const int64_t hd = n_heads * d;
  at::parallel_for(0, num_rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(hd), acc(hd), scores, kv(n_kv * d), inv(n_heads);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t ctx = ctx_lens[row];
      const int64_t lo = window > 0 ? std::max<int64_t>(0, ctx - window) : 0;  // first visible key
      const int64_t* table = tables + row * max_blocks;
      scores.resize(n_heads * ctx);
      const T* qp = q + row * q_stride;
      for (int64_t i = 0; i < hd; ++i) qf[i] = to_f(qp[i]) * scale;
      for (int64_t t = lo; t < ctx; ++t) {
        const int64_t slot = table[t / bs] * bs + (t % bs);
        for (int64_t g = 0; g < n_kv; ++g) kc.load(slot, g, kv.data() + g * d);
        for (int64_t h = 0; h < n_heads; ++h) {
          const float* qh = qf.data() + h * d;
          const float* kh = kv.data() + (h / group) * d;
          float dot = 0.f;
          for (int64_t i = 0; i < d; ++i) dot += qh[i] * kh[i];
          scores[h * ctx + t] = dot;
        }
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* sh = scores.data() + h * ctx;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t t = lo; t < ctx; ++t) m = sh[t] > m ? sh[t] : m;
        float l = 0.f;
        for (int64_t t = lo; t < ctx; ++t) {
          sh[t] = std::exp(sh[t] - m);
          l += sh[t];
        }
        inv[h] = l > 0.f ? 1.f / l : 0.f;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = lo; t < ctx; ++t) {
        const int64_t slot = table[t / bs] * bs + (t % bs);
        for (int64_t g = 0; g < n_kv; ++g) vc.load(slot, g, kv.data() + g * d);
        for (int64_t h = 0; h < n_heads; ++h) {
          const float p = scores[h * ctx + t];
          const float* vh = kv.data() + (h / group) * d;
          float* ah = acc.data() + h * d;
          for (int64_t i = 0; i < d; ++i) ah[i] += p * vh[i];
        }
      }
      T* op = out + row * out_stride;
      for (int64_t h = 0; h < n_heads; ++h)
        for (int64_t i = 0; i < d; ++i) op[h * d + i] = from_f<T>(acc[h * d + i] * inv[h]);
    }
  });
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// A cache line into L2, as an instruction the compiler keeps: GCC 12 deleted a loop of nothing
// but `_mm_prefetch` (`NextTile::prefetch` below) as one without effect.
inline void prefetch_l2(const char* p) { __asm__ volatile("prefetcht1 %0" : : "m"(*p)); }

// The cache lines of the tile a task reads next (every kv head of the task, `heads` from `g0`),
// asked for into L2 (T1) a slice at a time (one per query head) while the current tile computes:
// blocks are scattered, so the hardware prefetcher cannot guess where the next one is, and
// asking for a whole tile at once stalled the core until the miss buffers drained, so the reads
// waited for the compute and the compute for the reads. On a 2-core Zen 5, 30 layers' decode
// attention over the engine's mostly adjacent blocks went from 29 to 38 GB/s (AVX-512; the avx2
// level 33 to 38), a stream there reading ~40 a core; two tiles ahead was slower (35).
template <int TILE, typename KV>
struct NextTile {
  const char* rows[TILE];
  int64_t n = 0, row_lines = 0;

  void plan(const KV& cache, const int64_t* table, int64_t bs, int64_t t0, int64_t t_end, int64_t g0, int64_t heads) {
    n = std::max<int64_t>(0, std::min<int64_t>(TILE, t_end - t0));
    row_lines = (heads * cache.head_bytes() + 63) / 64;
    for (int64_t j = 0; j < n; ++j) rows[j] = cache.head_ptr(table[(t0 + j) / bs] * bs + (t0 + j) % bs, g0);
  }
  // After the key tile at t0 of a task's [lo, hi): the next key tile, or the values' first.
  void after_keys(const KV& kc, const KV& vc, const int64_t* table, int64_t bs, int64_t t0, int64_t lo, int64_t hi,
                  int64_t g0, int64_t heads) {
    if (t0 + TILE < hi) plan(kc, table, bs, t0 + TILE, hi, g0, heads);
    else plan(vc, table, bs, lo, hi, g0, heads);
  }
  // Slice k of `of` (k < of) of the tile's lines.
  void prefetch(int64_t k, int64_t of) const {
    const int64_t total = n * row_lines, lo = total * k / of, hi = total * (k + 1) / of;
    for (int64_t i = lo; i < hi; ++i) prefetch_l2(rows[i / row_lines] + (i % row_lines) * 64);
  }
};

// Whether a float32 cache's tiles can be read where they lie (see kv_tile).
template <typename KV>
inline bool reads_in_place(const KV&, int64_t bs, int tile) {
  return std::is_same_v<KV, pacer::PlainKV<float>> && bs % tile == 0;
}

// One tile of TILE tokens' keys or values from t0, every kv head of a task: row j is token
// t0 + j, its heads' floats from the returned pointer + j * the kernel's `stride`. A float32 cache is
// read where it lies when the tile is within one block (bs a multiple of TILE; tiles start at
// multiples of TILE), its rows the cache's slots apart; otherwise the rows are converted into
// `tile` (`heads * D` floats a row, the stride then; rows from `nk` on zeroed). In place, the
// rows past `nk` are the block's other slots, read and masked. Shared by the avx512 (16-token)
// and avx2 (8-token) decode tiles.
template <int TILE, typename KV>
inline const float* kv_tile(const KV& cache, const int64_t* table, int64_t bs, int64_t t0, int64_t nk,
                            int64_t g0, int64_t heads, int64_t D, float* tile, bool in_place) {
  if constexpr (std::is_same_v<KV, pacer::PlainKV<float>>) {
    if (in_place) return cache.base + (table[t0 / bs] * bs + t0 % bs) * cache.n_kv * D + g0 * D;
  }
  const int64_t width = heads * D;
  for (int64_t j = 0; j < TILE; ++j) {
    float* dst = tile + j * width;
    if (j < nk) {
      const int64_t t = t0 + j;
      for (int64_t g = 0; g < heads; ++g) cache.load(table[t / bs] * bs + t % bs, g0 + g, dst + g * D);
    } else {
      std::memset(dst, 0, width * sizeof(float));
    }
  }
  return tile;
}
#endif

#if defined(__AVX512F__)
template <int D, typename T, typename KV>
void decode_avx512(const T* q, int64_t q_stride, const KV kc, const KV vc, const int64_t* tables,
                   const int64_t* ctx_lens, T* out, int64_t out_stride, int64_t num_rows, int64_t n_heads,
                   int64_t n_kv, int64_t bs, int64_t max_blocks, float scale) {
  constexpr int C = D / 16;
  const int64_t group = n_heads / n_kv;
  const DecodePlan plan = plan_decode(ctx_lens, num_rows, n_kv);
  const int64_t hq = plan.heads_per_task * group;   // query heads of a task
  const int64_t width = plan.heads_per_task * D;    // floats per token in a copied tile
  const bool in_place = reads_in_place(kc, bs, 16);
  const int64_t stride = in_place ? n_kv * D : width;   // floats between a tile's rows
  const int64_t n_tasks = static_cast<int64_t>(plan.tasks.size());
  std::vector<float> part_acc(plan.n_slots * hq * D), part_ml(plan.n_slots * hq * 2);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> scores(hq * DECODE_PART), qs(hq * D), acc(hq * D), tile(16 * width), m(hq), l(hq);
    NextTile<16, KV> ahead;
    for (int64_t i = next++; i < n_tasks; i = next++) {
      const DecodeTask& task = plan.tasks[i];
      const int64_t row = task.row, g0 = task.g0, lo = task.t_lo, hi = task.t_hi;
      const int64_t n16 = (hi - lo + 15) / 16 * 16;
      const int64_t* table = tables + row * max_blocks;
      for (int64_t h = 0; h < hq; ++h)
        for (int c = 0; c < C; ++c)
          _mm512_storeu_ps(qs.data() + h * D + c * 16,
                           _mm512_mul_ps(pacer::load16(q + row * q_stride + (g0 * group + h) * D + c * 16),
                                         _mm512_set1_ps(scale)));
      // scores; query head h reads kv head h / group of the tile
      for (int64_t t0 = lo; t0 < hi; t0 += 16) {
        const int64_t nk = std::min<int64_t>(16, hi - t0);
        const float* kb = kv_tile<16>(kc, table, bs, t0, nk, g0, plan.heads_per_task, D, tile.data(), in_place);
        ahead.after_keys(kc, vc, table, bs, t0, lo, hi, g0, plan.heads_per_task);
        const __mmask16 valid = nk >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << nk) - 1);
        for (int64_t h = 0; h < hq; ++h) {
          ahead.prefetch(h, hq);
          const float* kt = kb + (h / group) * D;
          __m512 qv[C], part[16];
          for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(qs.data() + h * D + c * 16);
          for (int j = 0; j < 16; ++j) {
            __m512 sacc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kt + j * stride));
            for (int c = 1; c < C; ++c) sacc = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kt + j * stride + c * 16), sacc);
            part[j] = sacc;
          }
          const __m512 sc = _mm512_mask_blend_ps(valid, _mm512_set1_ps(neg_inf), pacer::reduce16(part));
          _mm512_storeu_ps(scores.data() + h * DECODE_PART + (t0 - lo), sc);
        }
      }
      // softmax numerators of the part, in place, with its max and sum
      for (int64_t h = 0; h < hq; ++h) {
        float* sh = scores.data() + h * DECODE_PART;
        __m512 mv = _mm512_set1_ps(neg_inf);
        for (int64_t t = 0; t < n16; t += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sh + t));
        m[h] = _mm512_reduce_max_ps(mv);
        const __m512 mx = _mm512_set1_ps(m[h]);
        __m512 sv = _mm512_setzero_ps();
        for (int64_t t = 0; t < n16; t += 16) {
          const __m512 e = pacer::exp16(_mm512_sub_ps(_mm512_loadu_ps(sh + t), mx));
          _mm512_storeu_ps(sh + t, e);
          sv = _mm512_add_ps(sv, e);
        }
        l[h] = _mm512_reduce_add_ps(sv);
      }
      // weighted sum of values
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t0 = lo; t0 < hi; t0 += 16) {
        const int64_t nk = std::min<int64_t>(16, hi - t0);
        const float* vb = kv_tile<16>(vc, table, bs, t0, nk, g0, plan.heads_per_task, D, tile.data(), in_place);
        ahead.plan(vc, table, bs, t0 + 16, hi, g0, plan.heads_per_task);
        for (int64_t h = 0; h < hq; ++h) {
          ahead.prefetch(h, hq);
          const float* vt = vb + (h / group) * D;
          __m512 a[C];
          for (int c = 0; c < C; ++c) a[c] = _mm512_loadu_ps(acc.data() + h * D + c * 16);
          const float* ph = scores.data() + h * DECODE_PART + (t0 - lo);
          for (int64_t j = 0; j < nk; ++j) {
            const __m512 p = _mm512_set1_ps(ph[j]);
            for (int c = 0; c < C; ++c) a[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vt + j * stride + c * 16), a[c]);
          }
          for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc.data() + h * D + c * 16, a[c]);
        }
      }
      finish_task(task, hq, D, acc.data(), m.data(), l.data(), out, out_stride, group, part_acc.data(), part_ml.data());
    }
  });
  if (plan.n_slots) combine_parts(plan, hq, D, group, part_acc.data(), part_ml.data(), out, out_stride);
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// decode_avx512's plan in 8 lanes (the avx2 level): tiles of 8 tokens, each score tile reduced
// across lanes at once (reduce8), exp8 for the softmax.
template <int D, typename T, typename KV>
void decode_avx2(const T* q, int64_t q_stride, const KV kc, const KV vc, const int64_t* tables,
                 const int64_t* ctx_lens, T* out, int64_t out_stride, int64_t num_rows, int64_t n_heads,
                 int64_t n_kv, int64_t bs, int64_t max_blocks, float scale) {
  constexpr int C = D / 8;
  const int64_t group = n_heads / n_kv;
  const DecodePlan plan = plan_decode(ctx_lens, num_rows, n_kv);
  const int64_t hq = plan.heads_per_task * group;
  const int64_t width = plan.heads_per_task * D;
  const bool in_place = reads_in_place(kc, bs, 8);
  const int64_t stride = in_place ? n_kv * D : width;
  const int64_t n_tasks = static_cast<int64_t>(plan.tasks.size());
  std::vector<float> part_acc(plan.n_slots * hq * D), part_ml(plan.n_slots * hq * 2);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> scores(hq * DECODE_PART), qs(hq * D), acc(hq * D), tile(8 * width), m(hq), l(hq);
    NextTile<8, KV> ahead;
    for (int64_t i = next++; i < n_tasks; i = next++) {
      const DecodeTask& task = plan.tasks[i];
      const int64_t row = task.row, g0 = task.g0, lo = task.t_lo, hi = task.t_hi;
      const int64_t n8 = (hi - lo + 7) / 8 * 8;
      const int64_t* table = tables + row * max_blocks;
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t k = 0; k < D; ++k) qs[h * D + k] = to_f(q[row * q_stride + (g0 * group + h) * D + k]) * scale;
      for (int64_t t0 = lo; t0 < hi; t0 += 8) {
        const int64_t nk = std::min<int64_t>(8, hi - t0);
        const float* kb = kv_tile<8>(kc, table, bs, t0, nk, g0, plan.heads_per_task, D, tile.data(), in_place);
        ahead.after_keys(kc, vc, table, bs, t0, lo, hi, g0, plan.heads_per_task);
        const __m256 valid = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(nk)), _CMP_LT_OQ);
        for (int64_t h = 0; h < hq; ++h) {
          ahead.prefetch(h, hq);
          const float* kt = kb + (h / group) * D;
          __m256 qv[C], part[8];
          for (int c = 0; c < C; ++c) qv[c] = _mm256_loadu_ps(qs.data() + h * D + c * 8);
          for (int j = 0; j < 8; ++j) {
            __m256 sacc = _mm256_mul_ps(qv[0], _mm256_loadu_ps(kt + j * stride));
            for (int c = 1; c < C; ++c) sacc = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(kt + j * stride + c * 8), sacc);
            part[j] = sacc;
          }
          const __m256 sc = _mm256_blendv_ps(_mm256_set1_ps(neg_inf), pacer::reduce8(part), valid);
          _mm256_storeu_ps(scores.data() + h * DECODE_PART + (t0 - lo), sc);
        }
      }
      for (int64_t h = 0; h < hq; ++h) {
        float* sh = scores.data() + h * DECODE_PART;
        __m256 mv = _mm256_set1_ps(neg_inf);
        for (int64_t t = 0; t < n8; t += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(sh + t));
        m[h] = pacer::hmax8(mv);
        const __m256 mx = _mm256_set1_ps(m[h]);
        __m256 sv = _mm256_setzero_ps();
        for (int64_t t = 0; t < n8; t += 8) {
          const __m256 e = pacer::exp8(_mm256_sub_ps(_mm256_loadu_ps(sh + t), mx));
          _mm256_storeu_ps(sh + t, e);
          sv = _mm256_add_ps(sv, e);
        }
        l[h] = pacer::hsum8(sv);
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t0 = lo; t0 < hi; t0 += 8) {
        const int64_t nk = std::min<int64_t>(8, hi - t0);
        const float* vb = kv_tile<8>(vc, table, bs, t0, nk, g0, plan.heads_per_task, D, tile.data(), in_place);
        ahead.plan(vc, table, bs, t0 + 8, hi, g0, plan.heads_per_task);
        for (int64_t h = 0; h < hq; ++h) {
          ahead.prefetch(h, hq);
          const float* vt = vb + (h / group) * D;
          __m256 a[C];
          for (int c = 0; c < C; ++c) a[c] = _mm256_loadu_ps(acc.data() + h * D + c * 8);
          const float* ph = scores.data() + h * DECODE_PART + (t0 - lo);
          for (int64_t j = 0; j < nk; ++j) {
            const __m256 p = _mm256_set1_ps(ph[j]);
            for (int c = 0; c < C; ++c) a[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vt + j * stride + c * 8), a[c]);
          }
          for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc.data() + h * D + c * 8, a[c]);
        }
      }
      finish_task(task, hq, D, acc.data(), m.data(), l.data(), out, out_stride, group, part_acc.data(), part_ml.data());
    }
  });
  if (plan.n_slots) combine_parts(plan, hq, D, group, part_acc.data(), part_ml.data(), out, out_stride);
}
#endif

}  // namespace

void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                            torch::Tensor block_tables, torch::Tensor context_lens, double scale, double k_scale,
                            double v_scale, int64_t window) {
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: none), got ", window);
  check_attention_args(out, q, k_cache, v_cache);
  TORCH_CHECK(block_tables.scalar_type() == torch::kLong && context_lens.scalar_type() == torch::kLong,
              "block_tables and context_lens must be int64");
  auto bt = block_tables.contiguous();
  auto cl = context_lens.contiguous();
  const int64_t rows = q.size(0), n_heads = q.size(1), d = q.size(2);
  const int64_t bs = k_cache.size(1), n_kv = k_cache.size(2);
  TORCH_CHECK(bt.dim() == 2 && bt.size(0) == rows && cl.numel() == rows, "one block-table row and length per row");
  std::vector<int64_t> used(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = cl.data_ptr<int64_t>()[r];
    TORCH_CHECK(len >= 1, "context_lens must be >= 1, got ", len);
    used[r] = (len + bs - 1) / bs;
  }
  check_block_tables(bt, used.data(), k_cache.size(0));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode_attention", [&] {
    pacer::with_kv_readers<scalar_t>(k_cache, v_cache, d, k_scale, v_scale, [&](auto kr, auto vr) {
#if defined(__AVX512F__)
      auto run = [&](auto dim) {
        decode_avx512<decltype(dim)::value, scalar_t>(
            q.data_ptr<scalar_t>(), q.stride(0), kr, vr, bt.data_ptr<int64_t>(), cl.data_ptr<int64_t>(),
            out.data_ptr<scalar_t>(), out.stride(0), rows, n_heads, n_kv, bs, bt.size(1), static_cast<float>(scale));
      };
      if (d == 64 && window == 0) return run(std::integral_constant<int, 64>{});
      if (d == 128 && window == 0) return run(std::integral_constant<int, 128>{});
#elif defined(__AVX2__) && defined(__FMA__)
      auto run = [&](auto dim) {
        decode_avx2<decltype(dim)::value, scalar_t>(
            q.data_ptr<scalar_t>(), q.stride(0), kr, vr, bt.data_ptr<int64_t>(), cl.data_ptr<int64_t>(),
            out.data_ptr<scalar_t>(), out.stride(0), rows, n_heads, n_kv, bs, bt.size(1), static_cast<float>(scale));
      };
      if (d == 64 && window == 0) return run(std::integral_constant<int, 64>{});
      if (d == 128 && window == 0) return run(std::integral_constant<int, 128>{});
#endif
      decode_kernel<scalar_t>(q.data_ptr<scalar_t>(), q.stride(0), kr, vr, bt.data_ptr<int64_t>(),
                              cl.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), out.stride(0), rows, n_heads, n_kv, d,
                              bs, bt.size(1), static_cast<float>(scale), window);
    });
  });
}
