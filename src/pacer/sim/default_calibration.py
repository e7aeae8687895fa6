"""Step-time fit for `cpu-local` shipped with pacer, used until `pacer sim calibrate` writes
~/.cache/pacer/sim/cpu-local.json.

Made by `pacer sim calibrate --num-threads 1` on the 2-core AMD EPYC development machine:
SmolLM2-135M-Instruct, float32, one torch thread, 2026-11-29T09:45:05Z, load average ~1.5-2 from other
developers' jobs. Executor fit median error 1.8% (p90 6.3%), engine steps median
1.8%; `pacer sim validate --num-threads 1` right after it: every metric within target (see
README). Calibrate again for other thread counts or machines.
"""

from __future__ import annotations

from typing import Any

DEFAULT_CPU_CALIBRATION: dict[str, Any] = {
    "model": "smollm2-135m",
    "dtype": "float32",
    "threads": 1,
    "coefficients": {
        "const": 0.03338, "linear_roofline_s": 0.0, "tokens": 0.002115, "sampled": 0.0006146,
        "seqs": 1.673e-05, "chunks": 0.0, "chunk_attn_pairs": 9.807e-07, "chunk_kv_tokens": 0.0,
        "single_kv_tokens": 1.446e-05, "single_padded_kv": 2.145e-07, "gemm_step": 0.01174,
        "tiny_gemm_step": 0.01113,
    },
}
