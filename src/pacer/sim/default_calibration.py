"""Step-time fit for `cpu-local` shipped with pacer, used until `pacer sim calibrate` writes
~/.cache/pacer/sim/cpu-local.json.

Made by `pacer sim calibrate` on the 2-core AMD EPYC development machine: SmolLM2-135M-Instruct,
float32, 2 torch threads, 2026-11-29T09:11:56Z, load average ~1-2 (other developers' jobs running);
executor fit median error 6.7% (p90 25.1%), engine steps median 8.0%.
"""

from __future__ import annotations

from typing import Any

DEFAULT_CPU_CALIBRATION: dict[str, Any] = {
    "model": "smollm2-135m",
    "dtype": "float32",
    "threads": 2,
    "coefficients": {
        "const": 0.04635, "linear_roofline_s": 0.0, "tokens": 0.001199, "sampled": 0.0, "seqs": 0.0005933,
        "chunks": 0.0, "chunk_attn_pairs": 5.121e-07, "chunk_kv_tokens": 5.26e-06,
        "single_kv_tokens": 5.476e-06, "single_padded_kv": 2.039e-06,
    },
}
