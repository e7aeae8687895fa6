"""`--isa avx2` for a benchmark: rerun this process with every library forced to its AVX2 paths.

An AVX-512 machine then stands in for an AVX2-only CPU (pacer's kernels and quantized linears,
oneDNN's linears, ATen's vectorized ops; `pacer.model.kernels.ISA_FORCING`). ATen reads its
switch when torch is imported, so `apply()` runs before the benchmark imports torch, and every
child process (a server, a peer engine) inherits the same environment. Peers built for the
machine (llama.cpp's `GGML_NATIVE`) are not forced by it: point `PEERS_DIR` at an AVX2 build.
"""

from __future__ import annotations

import os
import sys

from pacer.model.kernels import cpu_flags, forced_isa, isa_env

SHOWN = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_int8")


def requested(argv: list[str]) -> str:
    """The value of `--isa` in argv (`native` when absent)."""
    for i, arg in enumerate(argv):
        if arg == "--isa" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--isa="):
            return arg.split("=", 1)[1]
    return "native"


def apply(argv: list[str] | None = None) -> None:
    """Re-exec the running script with `--isa`'s environment when it is not in force yet."""
    argv = sys.argv if argv is None else argv
    env = isa_env(requested(argv))
    if env and any(os.environ.get(k) != v for k, v in env.items()):
        os.execve(sys.executable, [sys.executable, *argv], {**os.environ, **env})


def label() -> str:
    """`cpu flags ...` and, when forced, the level every library was held to."""
    flags = ",".join(f for f in SHOWN if f in cpu_flags()) or "none"
    isa = forced_isa()
    return f"cpu flags {flags}" + (f" (forced to {isa}: {' '.join(f'{k}={v}' for k, v in isa_env(isa).items())})"
                                   if isa else "")
