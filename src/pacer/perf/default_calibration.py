"""Step-time fit for `cpu-local` shipped with pacer, used until `pacer sim calibrate` writes
~/.cache/pacer/sim/cpu-local.json.

Made by `pacer sim calibrate --num-threads 1` on the 2-core AMD EPYC development machine:
SmolLM2-135M-Instruct, float32, one torch thread, oneDNN projections and the C++ kernels,
2026-11-29T11:26:10Z, load average ~1. Executor fit median error 2.2% (p90 5.7%), engine
steps median 2.1%; `pacer sim validate --num-threads 1` right after it: every metric within
target (docs/measurements/simulator.md). Calibrate again for other thread counts, machines or engine changes.
"""

from __future__ import annotations

from typing import Any

DEFAULT_CPU_CALIBRATION: dict[str, Any] = {
    "model": "smollm2-135m",
    "dtype": "float32",
    "threads": 1,
    "coefficients": {
        "const": 0.01702, "linear_roofline_s": 0.01797, "tokens": 0.0008243, "sampled": 0.0002461,
        "seqs": 1.602e-05, "chunks": 0.0, "chunk_attn_pairs": 6.554e-07, "chunk_kv_tokens": 0.0,
        "single_kv_tokens": 2.54e-06, "single_padded_kv": 6.216e-07, "gemm_step": 0.0,
        "tiny_gemm_step": 0.00136,
    },
}
