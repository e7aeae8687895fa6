#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // `window` > 0: each query sees only its `window` latest keys, itself included (sliding layers)
  m.def("paged_decode_attention", &paged_decode_attention, "paged attention for single-token rows",
        py::arg("out"), py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"),
        py::arg("context_lens"), py::arg("scale"), py::arg("k_scale"), py::arg("v_scale"), py::arg("window") = 0);
  m.def("paged_prefill_attention", &paged_prefill_attention, "causal paged attention for prefill chunks",
        py::arg("out"), py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("q_starts"), py::arg("q_lens"),
        py::arg("start_pos"), py::arg("block_tables"), py::arg("scale"), py::arg("k_scale"), py::arg("v_scale"),
        py::arg("window") = 0);
  m.def("rope_write_kv", &rope_write_kv, "rotate q, k in place in the fused qkv and store k, v in the paged cache");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of a fused gate_up output");
  m.def("add_rms_norm_", &add_rms_norm_, "x += delta (optional), return rms_norm(x) * weight");
  m.def("apply_token_bitmask_", &apply_token_bitmask_, "-inf where a packed token bitmask forbids (in place)");
}
