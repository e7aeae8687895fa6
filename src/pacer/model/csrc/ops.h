// The C++ operators of pacer's model path; bound to Python in bindings.cpp.
#pragma once
#include <torch/extension.h>

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale);
void rope_write_kv(torch::Tensor qkv, torch::Tensor positions, torch::Tensor cos, torch::Tensor sin,
                   torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slot_mapping, int64_t n_heads);
torch::Tensor silu_and_mul(torch::Tensor gate_up);
torch::Tensor add_rms_norm_(torch::Tensor x, c10::optional<torch::Tensor> delta, torch::Tensor weight, double eps);
void paged_prefill_attention(torch::Tensor out, torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                             torch::Tensor q_starts, torch::Tensor q_lens, torch::Tensor start_pos,
                             torch::Tensor block_tables, double scale);
