#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "paged attention for single-token rows");
  m.def("paged_prefill_attention", &paged_prefill_attention, "causal paged attention for prefill chunks");
  m.def("rope_write_kv", &rope_write_kv, "rotate q, k in place in the fused qkv and store k, v in the paged cache");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of a fused gate_up output");
  m.def("add_rms_norm_", &add_rms_norm_, "x += delta (optional), return rms_norm(x) * weight");
  m.def("apply_token_bitmask_", &apply_token_bitmask_, "-inf where a packed token bitmask forbids (in place)");
}
