"""More KV in the same memory: kv_cache_dtype on the real engine (default model, CPU).

    PYTHONPATH=src .venv/bin/python benchmarks/kv_memory.py [--full] [--only capacity,knee,decode]

1. capacity: blocks in the same kv_cache_memory for each kv_cache_dtype (the start-up line).
2. knee (the seed experiment): sweep max_num_seqs at a fixed kv_cache_memory, KV in the model's
   dtype (float32 on CPU) vs int8. One wave of max_num_seqs requests (prompt 128, output 128,
   ignore_eos; --full: 256 / 256 with twice the memory). Per point: recompute preemptions, TPOT
   p50 / p99, output tok/s. The knee is the largest max_num_seqs with no preemption and TPOT p99
   within 1.5x its p50 (past it, preempted requests' recompute shows in the tail).
3. decode: one decode step of 32 sequences x 1,024 context (--full: 64 x 2,048) through
   ModelExecutor.execute, full precision vs int8 vs fp8, repeats interleaved, median.
4. sessions: multi-turn conversations, round robin, whose contexts total ~4x the device tier:
   prefix hit rate and TTFT p50 with the device tier alone, with a host tier 4x its size
   (kv_offloading_size), and, as a control, one device tier of the combined size.

Times are noisy on a shared machine: compare the ratios printed side by side; the load average
is printed beside each figure. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from pacer.config import EngineConfig
from pacer.core.outputs import ScheduledRequest, SchedulerOutput
from pacer.engine import Engine
from pacer.model.runner import executor_for, kv_capacity_line
from pacer.request import SamplingParams


def load() -> str:
    return f"loadavg {os.getloadavg()[0]:.2f}"


def engine_for(base: Engine, **kw: Any) -> Engine:
    cfg = EngineConfig.from_kwargs(**kw)
    ex = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
    return Engine(cfg, ex, base.tokenizer, ex.num_blocks, base.max_model_len, base.eos_token_ids,
                  vocab_size=base.vocab_size)


def capacity(base: Engine, memory: str) -> None:
    print(f"== capacity in kv_cache_memory={memory}")
    model = base.executor.model
    for name in ("auto", "int8", "fp8_e4m3", "fp8_e5m2"):
        cfg = EngineConfig.from_kwargs(kv_cache_memory=memory, kv_cache_dtype=name)
        fmt = model.kv_format(name)
        a = model.arch
        n = cfg.cache.resolve_num_blocks(fmt.bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim))
        print("  " + kv_capacity_line(model, fmt, n, cfg.cache.block_size))


def one_wave(engine: Engine, seqs: int, prompt_len: int, out_len: int) -> dict[str, float]:
    params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
    vocab = engine.vocab_size or 1000
    for i in range(seqs):   # distinct prompts: no prefix sharing
        engine.add_request([(7 + i * 131 + j * 17) % (vocab - 10) + 5 for j in range(prompt_len)], params)
    t0 = time.perf_counter()
    outs = engine.run_until_done()
    wall = time.perf_counter() - t0
    tpots = sorted(t for o in outs if (t := o.metrics.tpot) is not None)
    pre = engine.cache_stats()["preemptions"]
    return {"preemptions": pre["recompute"] + pre["swap"], "tpot_p50": statistics.median(tpots) * 1000,
            "tpot_p99": tpots[min(len(tpots) - 1, int(0.99 * len(tpots)))] * 1000,
            "tok_s": sum(len(o.token_ids) for o in outs) / wall}


def knee(base: Engine, full: bool) -> None:
    prompt_len, out_len = (256, 256) if full else (128, 128)
    memory = "288MiB" if full else "144MiB"
    sweep = [8, 12, 16, 24, 32, 48, 64] + ([96, 128] if full else [])
    print(f"== knee: max_num_seqs sweep at kv_cache_memory={memory}, one wave, prompt {prompt_len} / "
          f"output {out_len}")
    knees: dict[str, int] = {}
    for name in ("auto", "int8"):
        knees[name], streak = 0, True
        for seqs in sweep:
            eng = engine_for(base, kv_cache_memory=memory, kv_cache_dtype=name, max_num_seqs=seqs,
                             enable_prefix_caching=False)
            r = one_wave(eng, seqs, prompt_len, out_len)
            ok = r["preemptions"] == 0 and r["tpot_p99"] <= 1.5 * r["tpot_p50"]
            streak = streak and ok     # the knee: the last point of the unbroken run from the start
            if streak:
                knees[name] = seqs
            print(f"  kv={name:<5} blocks={eng.cache_stats()['num_blocks']:>5} max_num_seqs={seqs:>4}  "
                  f"preemptions={r['preemptions']:>4}  tpot_p50={r['tpot_p50']:7.1f} ms  "
                  f"tpot_p99={r['tpot_p99']:7.1f} ms  out={r['tok_s']:6.1f} tok/s  {load()}")
    ratio = knees["int8"] / knees["auto"] if knees["auto"] else float("inf")
    print(f"  knee: auto at max_num_seqs={knees['auto']}, int8 at {knees['int8']} -> {ratio:.2f}x further")


def decode_step(base: Engine, full: bool, repeats: int = 5) -> None:
    n, ctx = (64, 2048) if full else (32, 1024)
    bs = 16
    per = -(-(ctx + 1) // bs)
    print(f"== decode step: {n} sequences x {ctx} context, median of {repeats} interleaved repeats")
    executors = {name: executor_for(base.executor.model, EngineConfig.from_kwargs(
        num_kv_blocks=n * per, kv_cache_dtype=name).cache) for name in ("auto", "int8", "fp8_e4m3")}
    params = SamplingParams(max_tokens=1, temperature=0.0)
    out = SchedulerOutput(0, [ScheduledRequest(f"r{i}", [11], ctx, list(range(i * per, (i + 1) * per)), True, True,
                                               False, 0, params) for i in range(n)], 0, n)
    times: dict[str, list[float]] = {name: [] for name in executors}
    for _ in range(repeats + 1):   # the first round warms up
        for name, ex in executors.items():
            t0 = time.perf_counter()
            ex.execute(out)
            times[name].append(time.perf_counter() - t0)
    ref = statistics.median(times["auto"][1:])
    for name, ts in times.items():
        med = statistics.median(ts[1:])
        print(f"  kv={name:<9} step {med * 1000:7.1f} ms  ({med / ref:.2f}x full precision)  {load()}")


def sessions(base: Engine, full: bool) -> None:
    """Multi-turn sessions, round robin, whose contexts total ~4x the device tier."""
    n_sessions, turns, device_blocks = (16, 4, 128) if full else (8, 4, 64)
    host_blocks = 4 * device_blocks
    tok = base.tokenizer
    print(f"== sessions: {n_sessions} sessions x {turns} turns, round robin, device tier {device_blocks} blocks "
          f"(x16 tokens); host tier {host_blocks} blocks")
    configs = [("device only", dict(num_kv_blocks=device_blocks)),
               ("device + host tier", dict(num_kv_blocks=device_blocks, kv_offloading_size=1.0,
                                           num_cpu_blocks=host_blocks)),
               ("control: one device tier of both sizes", dict(num_kv_blocks=device_blocks + host_blocks))]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    for label, kw in configs:
        eng = engine_for(base, **kw)
        convs = [list(tok.encode(f"Session {s}: " + " ".join(f"note {s}-{j} about the harbour and its boats."
                                                                  for j in range(12)))) for s in range(n_sessions)]
        prompt = cached = 0
        ttfts: list[float] = []
        total_ctx = 0
        t0 = time.perf_counter()
        for turn in range(turns):
            for s, conv in enumerate(convs):
                conv += tok.encode(f" Question {turn} of session {s}: what did note {turn} say, and why?")
                rid = eng.add_request(list(conv), params)
                out = [o for o in eng.run_until_done() if o.request_id == rid][0]
                prompt += len(conv)
                cached += out.num_cached_tokens
                if out.metrics.ttft is not None:
                    ttfts.append(out.metrics.ttft)
                conv += out.token_ids
        total_ctx = sum(len(c) for c in convs)
        tiers = eng.cache_stats()["tiers"]
        host = tiers.get("host", {})
        print(f"  {label:<40} hit_rate={cached / prompt:.3f}  ttft_p50={statistics.median(ttfts) * 1000:7.1f} ms  "
              f"host promotions={host.get('promotions', 0):>5} demotions={host.get('demotions', 0):>5}  "
              f"contexts total {total_ctx} tokens = {total_ctx / (device_blocks * 16):.1f}x device tier  "
              f"wall {time.perf_counter() - t0:5.1f}s  {load()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="full sizes (minutes longer)")
    ap.add_argument("--only", default="capacity,decode,sessions,knee", help="comma list of parts to run")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    parts = set(args.only.split(","))
    base = Engine.from_kwargs(num_kv_blocks=16, num_threads=args.threads)
    print(f"default model, {base.executor.model.dtype}, attention {base.executor.model.attention_backend}, "
          f"{args.threads} threads; {load()}")
    if "capacity" in parts:
        capacity(base, "1GiB")
    if "decode" in parts:
        decode_step(base, args.full)
    if "sessions" in parts:
        sessions(base, args.full)
    if "knee" in parts:
        knee(base, args.full)


if __name__ == "__main__":
    main()
