"""Step-time fit for `cpu-local` shipped with pacer (SmolLM2-135M, float32, this 2-core machine),
used until `pacer sim calibrate` writes ~/.cache/pacer/sim/cpu-local.json."""

from __future__ import annotations

from typing import Any

DEFAULT_CPU_CALIBRATION: dict[str, Any] = {
    "model": "smollm2-135m",
    "dtype": "float32",
    "coefficients": {
        "const": 0.004, "linear_roofline_s": 2.0, "tokens": 0.0, "sampled": 0.0005, "seqs": 0.0001,
        "chunks": 0.001, "chunk_attn_pairs": 0.0, "chunk_kv_tokens": 0.0, "single_kv_tokens": 0.0,
        "single_padded_kv": 0.0,
    },
}
