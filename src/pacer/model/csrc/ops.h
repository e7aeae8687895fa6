// The C++ operators of pacer's model path; bound to Python in bindings.cpp.
#pragma once
#include <torch/extension.h>

#include "kv_quant.h"

// Shapes and layouts both attention kernels take: q and out [rows, heads, head_dim] with each
// row's heads contiguous (rows may be strided: q is a view of the packed qkv), and the caches
// contiguous [blocks, block_size, kv_heads, width], both of one KV format (kv_quant.h): q's
// dtype (width head_dim), int8 with scales (head_dim + 2) or float8 (head_dim).
inline void check_attention_args(const torch::Tensor& out, const torch::Tensor& q, const torch::Tensor& k_cache,
                                 const torch::Tensor& v_cache) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "q must be [rows, heads, head_dim] with contiguous heads");
  TORCH_CHECK(out.sizes() == q.sizes() && out.stride(2) == 1 && out.stride(1) == out.size(2) &&
              out.scalar_type() == q.scalar_type(), "out must match q");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
              v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == k_cache.scalar_type(),
              "caches must be contiguous [blocks, block_size, kv_heads, width] of one dtype");
  const int64_t width = pacer::kv_head_width(k_cache.scalar_type(), q.scalar_type(), q.size(2));
  TORCH_CHECK(width >= 0, "cache dtype ", k_cache.scalar_type(), " is not a KV format for ", q.scalar_type(),
              " activations (q's dtype, int8 or float8)");
  TORCH_CHECK(k_cache.size(3) == width, "cache width ", k_cache.size(3), " should be ", width, " for head_dim ",
              q.size(2), " in ", k_cache.scalar_type());
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of kv heads");
}

// Checks that the first `n_blocks[r]` entries of each block-table row name real cache
// blocks, so a bad table raises instead of reading outside the cache.
inline void check_block_tables(const torch::Tensor& tables, const int64_t* n_blocks, int64_t num_cache_blocks) {
  const int64_t rows = tables.size(0), width = tables.size(1);
  const int64_t* t = tables.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(n_blocks[r] <= width, "row ", r, " needs ", n_blocks[r], " blocks; its table has ", width);
    for (int64_t b = 0; b < n_blocks[r]; ++b)
      TORCH_CHECK(t[r * width + b] >= 0 && t[r * width + b] < num_cache_blocks, "block table entry ",
                  t[r * width + b], " outside the cache of ", num_cache_blocks, " blocks");
  }
}

void paged_decode_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                            torch::Tensor block_tables, torch::Tensor context_lens, double scale, double k_scale,
                            double v_scale, int64_t window);
void rope_write_kv(torch::Tensor qkv, torch::Tensor positions, torch::Tensor cos, torch::Tensor sin,
                   torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slot_mapping, int64_t n_heads,
                   double k_scale, double v_scale);
torch::Tensor silu_and_mul(torch::Tensor gate_up);
torch::Tensor add_rms_norm_(torch::Tensor x, c10::optional<torch::Tensor> delta, torch::Tensor weight, double eps);
void paged_prefill_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                             torch::Tensor q_starts, torch::Tensor q_lens, torch::Tensor start_pos,
                             torch::Tensor block_tables, double scale, double k_scale, double v_scale,
                             int64_t window);
void apply_token_bitmask_(torch::Tensor logits, torch::Tensor bitmask, torch::Tensor dst, torch::Tensor src);
