"""Prefill attention on a chunk at a deep position against a whole prompt, in one run: does a
chunked prefill's attention run at the rate of an unchunked one?

The slo policy sizes prefill chunks to a decode's ITL budget (~100-300 tokens on a 2-core CPU),
and a long prompt's later chunks attend to 1,000-3,000 cached keys each. Their causal query-key
pairs add up to the whole prompt's, so the chunked prefill costs what the unchunked one does only
if the kernel runs both shapes at the same rate. It did not: a chunk's (row tile, kv head) tasks
were 3 for 2 threads (3 kv heads, one 128-row tile), and a thread sat idle a third of the time.

Run: PYTHONPATH=src python benchmarks/chunk_attention.py [--threads N] [--repeats 20]
Prints, per ISA level this CPU runs and shape (rows of the chunk @ its first position), the
median time per layer, GFLOP/s (4 x head size flops a query-key pair and query head), and the
ratio to the whole 2048-token prompt's rate at the same level.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from pacer.model import kernels

NH, NKV, D, BS = 9, 3, 64, 16   # SmolLM2-135M's attention
WHOLE = (2048, 0)
SHAPES = [WHOLE, (1024, 1024), (300, 300), (200, 800), (130, 1500), (130, 2500), (64, 2000), (257, 1200)]


def rate(K: object, q_len: int, start: int, repeats: int) -> tuple[float, float]:
    """(median seconds, GFLOP/s) of one chunk of `q_len` rows from position `start`, its context in
    shuffled cache blocks."""
    g = torch.Generator().manual_seed(q_len * 7919 + start)
    nb = -(-(start + q_len) // BS)
    kc = torch.randn(nb + 1, BS, NKV, D, generator=g)
    vc = torch.randn_like(kc)
    table = torch.randperm(nb, generator=g).unsqueeze(0).contiguous()
    q = torch.randn(q_len, NH, D, generator=g)
    out = torch.empty_like(q)
    args = (torch.tensor([0]), torch.tensor([q_len]), torch.tensor([start]), table, 0.125, 1.0, 1.0)
    K.paged_prefill_attention(out, q, kc, vc, *args)   # type: ignore[attr-defined]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        K.paged_prefill_attention(out, q, kc, vc, *args)   # type: ignore[attr-defined]
        times.append(time.perf_counter() - t)
    s = statistics.median(times)
    pairs = q_len * start + q_len * (q_len + 1) // 2
    return s, pairs * NH * D * 4 / s / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    flags = kernels.cpu_flags()
    shown = ",".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16") if f in flags)
    load = "/".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"chunk_attention  cpu flags {shown or 'none'}  threads {args.threads}  load {load}")
    for isa in kernels.supported_isas():
        K = kernels.load(isa)
        if K is None:
            print(f"{isa}: the kernels could not be built here")
            continue
        rate(K, *WHOLE, 3)   # warm-up: clocks and caches
        whole = rate(K, *WHOLE, args.repeats)[1]
        for q_len, start in SHAPES:
            s, gf = rate(K, q_len, start, args.repeats)
            print(f"{isa:>8}  {q_len:5d} rows @ {start:5d}: {s * 1e3:7.2f} ms/layer  {gf:6.1f} GFLOP/s  "
                  f"({gf / whole:.2f}x the whole prompt's)")
    print(f"load {'/'.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
