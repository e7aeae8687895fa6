"""Exact dedup of in-flight prefill (issue 28, part 1): a burst of requests sharing a long
prefix, with `prefill_dedup` off and on, side by side: prompt tokens computed, TTFT p50/p99 and
whether the outputs are identical. The real engine (default model, CPU) first, the simulator's
prediction of the same burst beside it (cpu-local profile), then H200 x llama-3.1-8b at scale.

    PYTHONPATH=src python benchmarks/prefill_dedup.py [--requests 8] [--shared 512] [--repeats 2]

Numbers depend on the machine and its load (printed); nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from pacer.config import EngineConfig
from pacer.request import SamplingParams


def loadavg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def cpu_flags() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "?"
    return ",".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f" {f}" in flags)


def prompts(n: int, shared: int, own: int, vocab: int = 20000) -> list[list[int]]:
    base = [100 + (7 * i) % vocab for i in range(shared)]
    return [base + [200 + (13 * i + 31 * k) % vocab for k in range(own)] for i in range(n)]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def line(label: str, outs: list[Any]) -> tuple[str, dict[str, list[int]], int, float]:
    ttfts = [o.metrics.ttft for o in outs]
    computed = sum(o.metrics.prefill_tokens for o in outs)
    text = (f"{label:18s} prompt tokens computed {computed:7d}  TTFT p50 {pct(ttfts, 50) * 1e3:8.1f} ms  "
            f"p99 {pct(ttfts, 99) * 1e3:8.1f} ms")
    return text, {o.request_id: list(o.token_ids) for o in outs}, computed, pct(ttfts, 50)


def run_real(args: argparse.Namespace, burst: list[list[int]]) -> dict[bool, list[float]]:
    import torch

    from pacer.engine import Engine
    from pacer.model.runner import executor_for

    torch.set_num_threads(args.num_threads)
    base = Engine.from_kwargs(num_kv_blocks=64, num_threads=args.num_threads)
    params = SamplingParams(max_tokens=args.output, temperature=0.0, ignore_eos=True)
    print(f"== real engine, default model, {args.num_threads} torch thread(s), burst of {len(burst)} x "
          f"({args.shared} shared + {args.own} own) tokens, {args.output} out  (load {loadavg()}, cpu {cpu_flags()})")
    ttft: dict[bool, list[float]] = {False: [], True: []}
    outputs: dict[bool, dict[str, list[int]]] = {}
    for rep in range(args.repeats):
        for dedup in (False, True):   # interleaved
            cfg = EngineConfig.from_kwargs(num_kv_blocks=args.blocks, prefill_dedup=dedup)
            ex = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
            eng = Engine(cfg, ex, base.tokenizer, ex.num_blocks, base.max_model_len, base.eos_token_ids,
                         vocab_size=base.vocab_size)
            for i, p in enumerate(burst):
                eng.add_request(p, params, request_id=f"r{i}")
            t = time.perf_counter()
            outs = eng.run_until_done()
            text, toks, _, p50 = line(f"run {rep + 1} dedup {'on ' if dedup else 'off'}", outs)
            print(f"{text}  ({time.perf_counter() - t:.1f} s, load {loadavg()})")
            ttft[dedup].append(p50)
            outputs.setdefault(dedup, toks)
    same = outputs[False] == outputs[True]
    off, on = statistics.median(ttft[False]), statistics.median(ttft[True])
    print(f"real: TTFT p50 dedup on / off = {on / off:.2f} (median of {args.repeats}); outputs identical: {same}")
    return ttft


def run_sim(label: str, burst: list[list[int]], output: int, hardware: str, model: str, **engine: Any) -> None:
    from pacer.perf.profiles import get_hardware, get_model
    from pacer.sim.simulator import SimRequest, build_sim_engine, simulate

    res = {}
    for dedup in (False, True):
        cfg = EngineConfig.from_kwargs(prefill_dedup=dedup, **engine)
        eng, ex, clock = build_sim_engine(cfg, get_hardware(hardware), get_model(model))
        reqs = [SimRequest(f"r{i}", 0.0, p, output) for i, p in enumerate(burst)]
        recs = simulate(eng, ex, clock, reqs).records
        ttfts = [r.ttft for r in recs if r.ttft is not None]
        res[dedup] = (sum(r.prefill_tokens for r in recs), pct(ttfts, 50), pct(ttfts, 99))
    for dedup, (computed, p50, p99) in res.items():
        print(f"{label} dedup {'on ' if dedup else 'off'}  prompt tokens computed {computed:7d}  TTFT p50 "
              f"{p50 * 1e3:8.1f} ms  p99 {p99 * 1e3:8.1f} ms")
    print(f"{label}: TTFT p50 dedup on / off = {res[True][1] / res[False][1]:.2f}; prompt tokens computed "
          f"{res[True][0] / res[False][0]:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=8, help="requests in the burst")
    ap.add_argument("--shared", type=int, default=512, help="tokens of the shared prefix")
    ap.add_argument("--own", type=int, default=32, help="tokens of each request's own suffix")
    ap.add_argument("--output", type=int, default=8, help="output tokens per request")
    ap.add_argument("--blocks", type=int, default=512, help="KV blocks of the real engine")
    ap.add_argument("--repeats", type=int, default=2, help="real runs per setting (interleaved)")
    ap.add_argument("--num-threads", type=int, default=2, help="torch threads of the real engine")
    ap.add_argument("--skip-real", action="store_true", help="only the simulated lines")
    args = ap.parse_args()
    burst = prompts(args.requests, args.shared, args.own)
    if not args.skip_real:
        run_real(args, burst)
    run_sim("sim cpu-local     ", burst, args.output, "cpu-local", "smollm2-135m", num_kv_blocks=args.blocks)
    big = prompts(64, 4096, 128)
    print("== simulated h200-sxm x llama-3.1-8b: burst of 64 x (4096 shared + 128 own), 64 out, "
          "max_num_batched_tokens 16384")
    run_sim("sim h200 8b       ", big, 64, "h200-sxm", "llama-3.1-8b", max_num_batched_tokens=16384)


if __name__ == "__main__":
    main()
