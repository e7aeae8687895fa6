// Causal paged attention for multi-token query rows (prefill chunks), read from the block
// tables like the decode kernel: a chunk attends to the context already cached before it
// and to its own keys (stored by rope_write_kv before this runs). The cache may be quantized
// (kv_quant.h): each key/value row is dequantised into the float tile as it is loaded.
//
// Work is split into tasks of (sequence, tile of query rows, kv head); the query heads of a
// GQA group share each key/value tile. Keys are processed 64 at a time: the tile of keys is
// transposed to float [d][64] so a query's 64 scores are runs of vector FMAs, then an online
// softmax (running max and sum per query, updated once per tile) folds the tile's values into
// float accumulators. Threads pull tasks from a shared counter, longest (latest rows) first.
// A chunk's rows are cut into tiles of at most QT, and finer (`row_tile_rows`) when its tasks would
// not spread evenly over the threads: one 130-row chunk on 3 kv heads made 3 tasks for 2 threads,
// and the step's attention ran at 143 GFLOP/s where 2 tiles of 65 rows run at ~185.
// With 16-key tiles the softmax's serial max-exp-rescale chain cost as much as the FMAs it sat
// between: the kernel ran at ~215 GFLOP/s on a 2-core Zen 5 where a linear reaches ~480.
#include "convert.h"
#include "ops.h"
#include "simd.h"

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>


namespace {

constexpr int64_t KT = 64;   // keys per tile
constexpr int64_t QT = 128;       // query rows per task, at most
constexpr int64_t MIN_ROWS = 16;  // and at least, where a chunk has them: one thread on 16 rows runs at
                                  // ~0.85 of its 128-row rate (the key tiles' loads amortised over less)

struct Task {
  int64_t seq, row0, rows, kv_head, keys;
};

// The vectorised tiles below share one shape: the tile's scores for up to RB query vectors into
// registers, an online-softmax update per vector over the whole KT-key tile (its max and exps
// once per 64 keys, not per 16), then the probabilities times the tile's values into the
// accumulators. visible[r]: the keys of the tile query r may see (causal); mx the running max,
// sm [RB][16] per-lane running sums (added across lanes at the end), acc the output rows.
// qf [RB][D] scaled queries, kt [D][KT] keys transposed, vt [KT][D] values.

#if defined(__AVX512F__)
using pacer::exp16;

template <int D, int RB>
inline void tile_avx512(const float* qf, const float* kt, const float* vt, const int64_t* visible,
                        float* mx, float* sm, float* acc) {
  constexpr int NV = KT / 16;   // score vectors of a row
  __m512 s[RB][NV];
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < NV; ++v) s[r][v] = _mm512_setzero_ps();
  for (int i = 0; i < D; ++i) {
    __m512 k[NV];
    for (int v = 0; v < NV; ++v) k[v] = _mm512_loadu_ps(kt + i * KT + v * 16);
    for (int r = 0; r < RB; ++r) {
      const __m512 qv = _mm512_set1_ps(qf[r * D + i]);
      for (int v = 0; v < NV; ++v) s[r][v] = _mm512_fmadd_ps(qv, k[v], s[r][v]);
    }
  }
  alignas(64) float p[RB][KT];
  alignas(64) float diff[16] = {0.f};
  alignas(64) float alpha[16];
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 esum[RB];
  int64_t last = 0;   // keys any of the rows sees: the values past it are not read
  for (int r = 0; r < RB; ++r) {
    const int64_t vis = std::min<int64_t>(KT, std::max<int64_t>(0, visible[r]));
    last = std::max(last, vis);
    __mmask16 mk[NV];
    __m512 mv = neg_inf;
    for (int v = 0; v < NV; ++v) {
      const int64_t n = vis - 16 * v;
      mk[v] = n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>(n <= 0 ? 0 : (1u << n) - 1);
      s[r][v] = _mm512_mask_blend_ps(mk[v], neg_inf, s[r][v]);
      mv = _mm512_max_ps(mv, s[r][v]);
    }
    const float m_new = vis > 0 ? std::max(mx[r], _mm512_reduce_max_ps(mv)) : mx[r];
    diff[r] = mx[r] - m_new;  // mx starts at a large finite negative, so this is finite
    mx[r] = m_new;
    const __m512 mr = _mm512_set1_ps(m_new);
    esum[r] = _mm512_setzero_ps();
    for (int v = 0; v < NV; ++v) {
      const __m512 e = _mm512_maskz_mov_ps(mk[v], exp16(_mm512_sub_ps(s[r][v], mr)));
      _mm512_store_ps(p[r] + v * 16, e);
      esum[r] = _mm512_add_ps(esum[r], e);
    }
  }
  _mm512_store_ps(alpha, exp16(_mm512_load_ps(diff)));  // the rescale factors of all rows at once
  for (int r = 0; r < RB; ++r)
    _mm512_storeu_ps(sm + r * 16, _mm512_fmadd_ps(_mm512_loadu_ps(sm + r * 16), _mm512_set1_ps(alpha[r]), esum[r]));
  for (int cb = 0; cb < D; cb += 64) {
    constexpr int NCMAX = 4;
    const int nc = (D - cb) / 16 < NCMAX ? (D - cb) / 16 : NCMAX;
    __m512 a[RB][NCMAX];
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < NCMAX; ++c)
        if (c < nc) a[r][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * D + cb + c * 16), _mm512_set1_ps(alpha[r]));
    for (int64_t j = 0; j < last; ++j) {
      for (int c = 0; c < NCMAX; ++c) {
        if (c < nc) {
          const __m512 v = _mm512_loadu_ps(vt + j * D + cb + c * 16);
          for (int r = 0; r < RB; ++r)
            a[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(p[r][j]), v, a[r][c]);
        }
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < NCMAX; ++c)
        if (c < nc) _mm512_storeu_ps(acc + r * D + cb + c * 16, a[r][c]);
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
using pacer::exp8;

// tile_avx512 for the avx2 level, in 16 registers: the scores 16 keys at a time (two 8-lane
// halves per row) into a buffer, the softmax over the buffer, the values 16 dims at a time.
template <int D, int RB>
inline void tile_avx2(const float* qf, const float* kt, const float* vt, const int64_t* visible,
                      float* mx, float* sm, float* acc) {
  int64_t vis[RB], last = 0;   // keys each row sees; any row
  for (int r = 0; r < RB; ++r) {
    vis[r] = std::min<int64_t>(KT, std::max<int64_t>(0, visible[r]));
    last = std::max(last, vis[r]);
  }
  alignas(32) float p[RB][KT];   // the scores, then their exps
  for (int64_t k0 = 0; k0 < last; k0 += 16) {
    __m256 s0[RB], s1[RB];  // scores of keys k0..k0+7 and k0+8..k0+15
    for (int r = 0; r < RB; ++r) { s0[r] = _mm256_setzero_ps(); s1[r] = _mm256_setzero_ps(); }
    for (int i = 0; i < D; ++i) {
      const __m256 ka = _mm256_loadu_ps(kt + i * KT + k0), kb = _mm256_loadu_ps(kt + i * KT + k0 + 8);
      for (int r = 0; r < RB; ++r) {
        const __m256 qv = _mm256_set1_ps(qf[r * D + i]);
        s0[r] = _mm256_fmadd_ps(qv, ka, s0[r]);
        s1[r] = _mm256_fmadd_ps(qv, kb, s1[r]);
      }
    }
    for (int r = 0; r < RB; ++r) {
      _mm256_store_ps(p[r] + k0, s0[r]);
      _mm256_store_ps(p[r] + k0 + 8, s1[r]);
    }
  }
  const int64_t n16 = (last + 15) / 16 * 16;   // the key columns written above
  alignas(32) float diff[8] = {0.f};
  alignas(32) float alpha[8];
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 esum[RB];
  for (int r = 0; r < RB; ++r) {
    __m256 mv = neg_inf;
    for (int64_t k0 = 0; k0 < n16; k0 += 8) {
      const __m256 ok = _mm256_cmp_ps(_mm256_add_ps(lane, _mm256_set1_ps(static_cast<float>(k0))),
                                      _mm256_set1_ps(static_cast<float>(vis[r])), _CMP_LT_OQ);
      const __m256 sc = _mm256_blendv_ps(neg_inf, _mm256_load_ps(p[r] + k0), ok);
      _mm256_store_ps(p[r] + k0, sc);
      mv = _mm256_max_ps(mv, sc);
    }
    const float m_new = vis[r] > 0 ? std::max(mx[r], pacer::hmax8(mv)) : mx[r];
    diff[r] = mx[r] - m_new;  // mx starts at a large finite negative, so this is finite
    mx[r] = m_new;
    const __m256 mr = _mm256_set1_ps(m_new);
    esum[r] = _mm256_setzero_ps();
    for (int64_t k0 = 0; k0 < n16; k0 += 8) {   // exp(-inf - m) is 0: the masked keys drop out
      const __m256 e = exp8(_mm256_sub_ps(_mm256_load_ps(p[r] + k0), mr));
      _mm256_store_ps(p[r] + k0, e);
      esum[r] = _mm256_add_ps(esum[r], e);
    }
  }
  _mm256_store_ps(alpha, exp8(_mm256_load_ps(diff)));
  for (int r = 0; r < RB; ++r)   // per-lane sums in the row's first 8 of 16 lanes (the rest stay 0)
    _mm256_storeu_ps(sm + r * 16, _mm256_fmadd_ps(_mm256_loadu_ps(sm + r * 16), _mm256_set1_ps(alpha[r]), esum[r]));
  for (int cb = 0; cb < D; cb += 16) {
    __m256 a[RB][2];
    for (int r = 0; r < RB; ++r) {
      const __m256 ar = _mm256_set1_ps(alpha[r]);
      a[r][0] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + cb), ar);
      a[r][1] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + cb + 8), ar);
    }
    for (int64_t j = 0; j < last; ++j) {
      const __m256 v0 = _mm256_loadu_ps(vt + j * D + cb), v1 = _mm256_loadu_ps(vt + j * D + cb + 8);
      for (int r = 0; r < RB; ++r) {
        const __m256 pj = _mm256_set1_ps(p[r][j]);
        a[r][0] = _mm256_fmadd_ps(pj, v0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(pj, v1, a[r][1]);
      }
    }
    for (int r = 0; r < RB; ++r) {
      _mm256_storeu_ps(acc + r * D + cb, a[r][0]);
      _mm256_storeu_ps(acc + r * D + cb + 8, a[r][1]);
    }
  }
}

#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define PACER_PREFILL_TILES 1
// Query vectors per call at most (RB, a template argument: no branch on it). AVX-512: 4 rows x 4
// score vectors = 16 of 32 registers; AVX2: 6 rows x 2 = 12 of 16, whose 12 FMA chains hide the
// latency the 8 of 4 rows did not.
#if defined(__AVX512F__)
constexpr int RBM = 4;
#else
constexpr int RBM = 6;
#endif

template <int D, int RB>
inline void tile_rb(const float* qf, const float* kt, const float* vt, const int64_t* visible, float* mx, float* sm,
                    float* acc) {
#if defined(__AVX512F__)
  tile_avx512<D, RB>(qf, kt, vt, visible, mx, sm, acc);
#else
  tile_avx2<D, RB>(qf, kt, vt, visible, mx, sm, acc);
#endif
}

// One tile for `rb` (1..RB) query vectors: the kernel instantiated for that many rows.
template <int D, int RB = RBM>
inline void tile(const float* qf, const float* kt, const float* vt, const int64_t* visible, int rb, float* mx,
                 float* sm, float* acc) {
  if constexpr (RB > 1) {
    if (rb < RB) return tile<D, RB - 1>(qf, kt, vt, visible, rb, mx, sm, acc);
  }
  tile_rb<D, RB>(qf, kt, vt, visible, mx, sm, acc);
}
#endif

// The key tile transposed for the score loops: kt[i * KT + j] = dimension i of key j, from the
// keys as rows [KT][d]. Where AVX2 is, in 8 x 8 blocks in registers, in place of an element-wise
// scatter: a few percent of the kernel's time on the 2-core AVX2 machine (a 64-row chunk at
// position 1,000: 18.3-19.3 ns per query-key pair and layer before, 17.3-17.8 after, quiet runs).
#if defined(__AVX2__)
inline void transpose8(__m256* r) {
  __m256 t[8], u[8];
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
    u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x20);
    r[k + 4] = _mm256_permute2f128_ps(u[k], u[k + 4], 0x31);
  }
}
#endif

inline void transpose_keys(const float* rows, int64_t d, float* kt) {
#if defined(__AVX2__)
  if (d % 8 == 0) {
    for (int64_t j0 = 0; j0 < KT; j0 += 8)
      for (int64_t i0 = 0; i0 < d; i0 += 8) {
        __m256 r[8];
        for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(rows + (j0 + k) * d + i0);
        transpose8(r);
        for (int k = 0; k < 8; ++k) _mm256_storeu_ps(kt + (i0 + k) * KT + j0, r[k]);
      }
    return;
  }
#endif
  for (int64_t j = 0; j < KT; ++j)
    for (int64_t i = 0; i < d; ++i) kt[i * KT + j] = rows[j * d + i];
}

// Each chunk's rows per tile: as few tiles as QT allows, of equal size; then, while the
// (chunk, row tile, kv head) tasks neither divide evenly among the threads nor are many (>= 8 a
// thread, where largest-first pulling evens them out), one more tile for the chunk whose tiles
// are largest, down to MIN_ROWS rows.
std::vector<int64_t> row_tile_rows(const int64_t* q_lens, int64_t num_seqs, int64_t n_kv, int64_t threads) {
  std::vector<int64_t> tiles(num_seqs);
  int64_t tasks = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    tiles[s] = std::max<int64_t>(1, (q_lens[s] + QT - 1) / QT);
    tasks += tiles[s] * n_kv;
  }
  while (threads > 1 && tasks % threads != 0 && tasks < 8 * threads) {
    int64_t best = -1;
    for (int64_t s = 0; s < num_seqs; ++s)
      if (q_lens[s] / (tiles[s] + 1) >= MIN_ROWS &&
          (best < 0 || q_lens[s] * tiles[best] > q_lens[best] * tiles[s]))
        best = s;
    if (best < 0) break;
    ++tiles[best];
    tasks += n_kv;
  }
  std::vector<int64_t> rows(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) rows[s] = std::max<int64_t>(1, (q_lens[s] + tiles[s] - 1) / tiles[s]);
  return rows;
}

template <typename T, typename KV>
void prefill_kernel(T* out, int64_t out_stride, const T* q, int64_t q_stride, const KV kc, const KV vc,
                    const int64_t* q_starts, const int64_t* q_lens, const int64_t* start_pos,
                    const int64_t* tables, int64_t max_blocks, int64_t num_seqs, int64_t n_heads, int64_t n_kv,
                    int64_t d, int64_t bs, float scale, int64_t window) {
  const int64_t group = n_heads / n_kv;
  std::vector<Task> tasks;
  const std::vector<int64_t> tile_rows = row_tile_rows(q_lens, num_seqs, n_kv, at::get_num_threads());
  for (int64_t s = 0; s < num_seqs; ++s)
    for (int64_t r0 = 0; r0 < q_lens[s]; r0 += tile_rows[s]) {
      const int64_t rows = std::min(tile_rows[s], q_lens[s] - r0);
      for (int64_t g = 0; g < n_kv; ++g) tasks.push_back({s, r0, rows, g, start_pos[s] + r0 + rows});
    }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.keys > b.keys; });
  std::atomic<int64_t> next{0};
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const float neg_inf = -std::numeric_limits<float>::infinity();

  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    const int64_t M = QT * group;
    std::vector<float> qf(M * d), acc(M * d), mx(M), sum(M), sum16(M * 16), kt(d * KT), vt(KT * d), p(KT), krows(KT * d);
    for (int64_t ti = next++; ti < n_tasks; ti = next++) {
      const Task& tk = tasks[ti];
      const int64_t* table = tables + tk.seq * max_blocks;
      const int64_t pos0 = start_pos[tk.seq] + tk.row0;  // position of the tile's first query
      const int64_t m_rows = tk.rows * group;             // query vectors: row-major (row, head in group)
      for (int64_t r = 0; r < tk.rows; ++r)
        for (int64_t h = 0; h < group; ++h) {
          const T* src = q + (q_starts[tk.seq] + tk.row0 + r) * q_stride + (tk.kv_head * group + h) * d;
          float* dst = qf.data() + (r * group + h) * d;
          for (int64_t i = 0; i < d; ++i) dst[i] = pacer::to_f(src[i]) * scale;
        }
      std::fill(acc.begin(), acc.begin() + m_rows * d, 0.f);
      // a finite "minus infinity", so the first tile's rescale exp(mx - m_new) is a plain 0
      std::fill(mx.begin(), mx.begin() + m_rows, -1e30f);
      std::fill(sum.begin(), sum.begin() + m_rows, 0.f);
      std::fill(sum16.begin(), sum16.begin() + m_rows * 16, 0.f);
      // a sliding window: no key before the first query's window is read (tiles stay KT-aligned)
      const int64_t first_key = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) / KT * KT : 0;
      for (int64_t t0 = first_key; t0 < tk.keys; t0 += KT) {
        const int64_t nk = std::min(KT, tk.keys - t0);
        for (int64_t j = 0; j < nk; ++j) {
          const int64_t t = t0 + j, slot = table[t / bs] * bs + t % bs;
          kc.load(slot, tk.kv_head, krows.data() + j * d);
          vc.load(slot, tk.kv_head, vt.data() + j * d);
        }
        std::fill(krows.begin() + nk * d, krows.end(), 0.f);
        std::fill(vt.begin() + nk * d, vt.end(), 0.f);
        transpose_keys(krows.data(), d, kt.data());
#if defined(PACER_PREFILL_TILES)
        if ((d == 64 || d == 128) && window == 0) {
          for (int64_t m = 0; m < m_rows; m += RBM) {
            const int rb = static_cast<int>(std::min<int64_t>(RBM, m_rows - m));
            int64_t vis[RBM] = {};
            bool any = false;
            for (int r = 0; r < rb; ++r) {
              vis[r] = std::min(nk, pos0 + (m + r) / group - t0 + 1);
              any = any || vis[r] > 0;
            }
            if (!any) continue;
            if (d == 64)
              tile<64>(qf.data() + m * d, kt.data(), vt.data(), vis, rb, mx.data() + m, sum16.data() + m * 16,
                       acc.data() + m * d);
            else
              tile<128>(qf.data() + m * d, kt.data(), vt.data(), vis, rb, mx.data() + m, sum16.data() + m * 16,
                        acc.data() + m * d);
          }
          continue;
        }
#endif
        for (int64_t m = 0; m < m_rows; ++m) {
          const int64_t qpos = pos0 + m / group;
          const int64_t visible = std::min(nk, qpos - t0 + 1);  // keys t0 .. qpos of this tile
          // and, in a sliding window, from qpos - window + 1 on
          const int64_t lo = window > 0 ? std::max<int64_t>(0, qpos - window + 1 - t0) : 0;
          if (visible <= lo) continue;
          float s[KT] = {0.f};
          const float* qm = qf.data() + m * d;
          for (int64_t i = 0; i < d; ++i) {
            const float qv = qm[i];
            const float* kr = kt.data() + i * KT;
            for (int64_t j = 0; j < KT; ++j) s[j] += qv * kr[j];
          }
          float tile_max = neg_inf;
          for (int64_t j = lo; j < visible; ++j) tile_max = std::max(tile_max, s[j]);
          const float m_new = std::max(mx[m], tile_max);
          const float alpha = std::exp(mx[m] - m_new);
          float tile_sum = 0.f;
          for (int64_t j = 0; j < KT; ++j) {
            const float e = std::exp(s[j] - m_new);
            p[j] = j >= lo && j < visible ? e : 0.f;
            tile_sum += p[j];
          }
          mx[m] = m_new;
          sum[m] = sum[m] * alpha + tile_sum;
          float* am = acc.data() + m * d;
          for (int64_t i = 0; i < d; ++i) am[i] *= alpha;
          for (int64_t j = lo; j < visible; ++j) {
            const float pj = p[j];
            const float* vr = vt.data() + j * d;
            for (int64_t i = 0; i < d; ++i) am[i] += pj * vr[i];
          }
        }
      }
      for (int64_t r = 0; r < tk.rows; ++r)
        for (int64_t h = 0; h < group; ++h) {
          const int64_t m = r * group + h;
          float total = sum[m];  // the scalar path's sum, or the vector path's lanes
          for (int64_t l = 0; l < 16; ++l) total += sum16[m * 16 + l];
          const float inv = total > 0.f ? 1.f / total : 0.f;
          T* dst = out + (q_starts[tk.seq] + tk.row0 + r) * out_stride + (tk.kv_head * group + h) * d;
          const float* am = acc.data() + m * d;
          for (int64_t i = 0; i < d; ++i) dst[i] = pacer::from_f<T>(am[i] * inv);
        }
    }
  });
}

}  // namespace

void paged_prefill_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                             torch::Tensor q_starts, torch::Tensor q_lens, torch::Tensor start_pos,
                             torch::Tensor block_tables, double scale, double k_scale, double v_scale,
                             int64_t window) {
  check_attention_args(out, q, k_cache, v_cache);
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: none), got ", window);
  for (const auto* t : {&q_starts, &q_lens, &start_pos, &block_tables})
    TORCH_CHECK(t->scalar_type() == torch::kLong, "sequence descriptors and block tables must be int64");
  auto qs = q_starts.contiguous(), ql = q_lens.contiguous(), sp = start_pos.contiguous();
  auto bt = block_tables.contiguous();
  const int64_t num_seqs = qs.size(0), n_heads = q.size(1), d = q.size(2);
  const int64_t bs = k_cache.size(1), n_kv = k_cache.size(2);
  TORCH_CHECK(ql.size(0) == num_seqs && sp.size(0) == num_seqs && bt.size(0) == num_seqs,
              "one q_start, q_len, start_pos and block-table row per sequence");
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t* qsp = qs.data_ptr<int64_t>();
    const int64_t* qlp = ql.data_ptr<int64_t>();
    const int64_t* spp = sp.data_ptr<int64_t>();
    TORCH_CHECK(qlp[s] >= 0 && qsp[s] >= 0 && qsp[s] + qlp[s] <= q.size(0), "query rows out of range");
    TORCH_CHECK(spp[s] >= 0 && (spp[s] + qlp[s] + bs - 1) / bs <= bt.size(1), "context exceeds its block table");
  }
  std::vector<int64_t> used(num_seqs);
  for (int64_t s = 0; s < num_seqs; ++s) used[s] = (sp.data_ptr<int64_t>()[s] + ql.data_ptr<int64_t>()[s] + bs - 1) / bs;
  check_block_tables(bt, used.data(), k_cache.size(0));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_prefill_attention", [&] {
    pacer::with_kv_readers<scalar_t>(k_cache, v_cache, d, k_scale, v_scale, [&](auto kr, auto vr) {
      prefill_kernel<scalar_t>(out.data_ptr<scalar_t>(), out.stride(0), q.data_ptr<scalar_t>(), q.stride(0), kr, vr,
                               qs.data_ptr<int64_t>(), ql.data_ptr<int64_t>(), sp.data_ptr<int64_t>(),
                               bt.data_ptr<int64_t>(), bt.size(1), num_seqs, n_heads, n_kv, d, bs,
                               static_cast<float>(scale), window);
    });
  });
}
