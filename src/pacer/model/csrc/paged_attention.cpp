// Paged attention for single-token query rows (decode), read straight from the block
// tables: no gather copy of the context. One task per request; the query heads of a GQA
// group share each key/value read. Softmax in float32.
#include "convert.h"
#include "ops.h"

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using pacer::from_f;
using pacer::to_f;

template <typename T>
void decode_kernel(const T* q, const T* kc, const T* vc, const int64_t* tables, const int64_t* ctx_lens,
                   T* out, int64_t num_rows, int64_t n_heads, int64_t n_kv, int64_t d, int64_t bs,
                   int64_t max_blocks, float scale) {
  // One task per row. Keys are read token by token in cache order (all kv heads of a slot
  // are contiguous), so each block is streamed from memory once; then one vectorisable exp
  // over each head's scores; then the weighted sum of values in the same order.
  const int64_t group = n_heads / n_kv;
  const int64_t hd = n_heads * d;
  at::parallel_for(0, num_rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(hd), acc(hd), scores, kv(n_kv * d), inv(n_heads);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t ctx = ctx_lens[row];
      const int64_t* table = tables + row * max_blocks;
      scores.resize(n_heads * ctx);
      const T* qp = q + row * hd;
      for (int64_t i = 0; i < hd; ++i) qf[i] = to_f(qp[i]) * scale;
      for (int64_t t = 0; t < ctx; ++t) {
        const int64_t slot = table[t / bs] * bs + (t % bs);
        const T* kp = kc + slot * n_kv * d;
        for (int64_t i = 0; i < n_kv * d; ++i) kv[i] = to_f(kp[i]);
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
        for (int64_t t = 0; t < ctx; ++t) m = sh[t] > m ? sh[t] : m;
        float l = 0.f;
        for (int64_t t = 0; t < ctx; ++t) {
          sh[t] = std::exp(sh[t] - m);
          l += sh[t];
        }
        inv[h] = l > 0.f ? 1.f / l : 0.f;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < ctx; ++t) {
        const int64_t slot = table[t / bs] * bs + (t % bs);
        const T* vp = vc + slot * n_kv * d;
        for (int64_t i = 0; i < n_kv * d; ++i) kv[i] = to_f(vp[i]);
        for (int64_t h = 0; h < n_heads; ++h) {
          const float p = scores[h * ctx + t];
          const float* vh = kv.data() + (h / group) * d;
          float* ah = acc.data() + h * d;
          for (int64_t i = 0; i < d; ++i) ah[i] += p * vh[i];
        }
      }
      T* op = out + row * hd;
      for (int64_t h = 0; h < n_heads; ++h)
        for (int64_t i = 0; i < d; ++i) op[h * d + i] = from_f<T>(acc[h * d + i] * inv[h]);
    }
  });
}

}  // namespace

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "q must be contiguous [rows, heads, head_dim]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "caches must be contiguous [blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(block_tables.scalar_type() == torch::kLong && context_lens.scalar_type() == torch::kLong,
              "block_tables and context_lens must be int64");
  auto bt = block_tables.contiguous();
  auto cl = context_lens.contiguous();
  const int64_t rows = q.size(0), n_heads = q.size(1), d = q.size(2);
  const int64_t bs = k_cache.size(1), n_kv = k_cache.size(2);
  TORCH_CHECK(n_heads % n_kv == 0, "heads must be a multiple of kv heads");
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode_attention", [&] {
    decode_kernel<scalar_t>(q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(),
                            bt.data_ptr<int64_t>(), cl.data_ptr<int64_t>(), out.data_ptr<scalar_t>(), rows,
                            n_heads, n_kv, d, bs, bt.size(1), static_cast<float>(scale));
  });
  return out;
}
