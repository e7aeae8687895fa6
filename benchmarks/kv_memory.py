"""More KV in the same memory: kv_cache_dtype on the real engine (default model, CPU).

    PYTHONPATH=src .venv/bin/python benchmarks/kv_memory.py [--full] [--only capacity,knee,decode]

1. capacity: blocks in the same kv_cache_memory for each kv_cache_dtype (the start-up line).
2. knee (the seed experiment): sweep max_num_seqs at a fixed kv_cache_memory, KV in the model's
   dtype (float32 on CPU) vs int8. One wave of max_num_seqs requests (prompt 64, output 32,
   ignore_eos, 52MiB; --full: 256 / 256 in 288MiB), both dtypes at each point; TPOT timed on the
   engine thread's CPU clock (one torch thread), which the other processes sharing the cores do
   not stretch (on wall time their noise bends TPOT p99 at random). Per point:
   preemptions, TPOT p50 / p99, output tok/s. The knee is found by `pacer tune`'s rule
   (pacer.tune.method.find_knee): the point before preemptions start (> 0.05 per request)
   or TPOT p99 bends up.
3. decode: one decode step of 32 sequences x 1,024 context (--full: 64 x 2,048) through
   ModelExecutor.execute, full precision vs int8 vs fp8: each executor's KV holds real values
   (one prefill, copied to every sequence's blocks), the same step at a 16-token context shows
   the part that reads the context; warm-up excluded, repeats interleaved, median.
4. sessions: multi-turn conversations, round robin, whose contexts total ~4x the device tier:
   prefix hit rate and TTFT p50 with the device tier alone, with a host tier 8x its size
   (kv_offloading_size), and, as a control, one device tier of the combined size.
5. restart: the disk tier (kv_offloading_dir): a prompt served, a graceful shutdown, and the first
   request of a restarted engine (it hits, promoted from the host tier) beside a cold engine's.

Times are noisy on a shared machine: compare the ratios printed side by side; the load average
is printed beside each figure. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.engine.build import kv_tiers
from pacer.kv.tiers.disk import DiskTier
from pacer.model.executor import ModelExecutor
from pacer.model.runner import executor_for, kv_capacity_line
from pacer.request import SamplingParams
from pacer.sched.contract import ScheduledRequest, SchedulerOutput
from pacer.tune.method import PREEMPTION_TOLERANCE, TURN, find_knee


def load() -> str:
    return f"loadavg {os.getloadavg()[0]:.2f}"


class ThreadCPUClock:
    """The engine thread's CPU time as its clock. With one torch thread every forward runs on
    the thread that steps the engine, so other processes on the shared cores, which stretch
    wall time by 2-4x at random, do not stretch this; a wave adds all its requests up front,
    so nothing waits on it."""

    def now(self) -> float:
        return time.thread_time()

    def wait_until(self, t: float) -> None:
        pass


def engine_for(base: Engine, clock: Any = None, **kw: Any) -> Engine:
    cfg = EngineConfig.from_kwargs(**kw)
    ex = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
    return Engine(cfg, ex, base.tokenizer, ex.num_blocks, base.max_model_len, base.eos_token_ids,
                  clock=clock, vocab_size=base.vocab_size, tiers=kv_tiers(cfg, ex))


def disk_tier_of(eng: Engine) -> DiskTier:
    (disk,) = (t for t in eng.tiers if isinstance(t, DiskTier))
    return disk


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
    return {"preemptions": engine.snapshot().num_preemptions, "tpot_p50": statistics.median(tpots) * 1000,
            "tpot_p99": tpots[min(len(tpots) - 1, int(0.99 * len(tpots)))] * 1000,
            "tok_s": sum(len(o.token_ids) for o in outs) / wall}


def knee(base: Engine, full: bool, repeats: int = 1) -> None:
    """The seed experiment: the max_num_seqs sweep, both KV dtypes at each point side by side,
    the sweep repeated (order alternated) and each point's median taken; the knee by `pacer
    tune`'s rule (pacer.tune.method.find_knee)."""
    prompt_len, out_len = (256, 256) if full else (64, 32)
    memory = "288MiB" if full else "52MiB"
    sweep = [8, 12, 16, 24, 32, 48, 64] + ([96, 128] if full else [])
    print(f"== knee: max_num_seqs sweep at kv_cache_memory={memory}, one wave, prompt {prompt_len} / "
          f"output {out_len}, {repeats} sweep(s), TPOT on the engine thread's CPU clock; knee rule (pacer tune's): > {PREEMPTION_TOLERANCE:g} "
          f"preemptions per request, or TPOT p99 growth > {TURN:g}x the previous growth")
    names = ("auto", "int8")
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(n, s): [] for n in names for s in sweep}
    blocks: dict[str, int] = {}
    for rep in range(repeats):
        for i, seqs in enumerate(sweep):
            for name in names if (i + rep) % 2 == 0 else names[::-1]:   # order alternated
                eng = engine_for(base, ThreadCPUClock(), kv_cache_memory=memory, kv_cache_dtype=name,
                                 max_num_seqs=seqs, enable_prefix_caching=False)
                blocks[name] = eng.snapshot().num_blocks
                runs[(name, seqs)].append(one_wave(eng, seqs, prompt_len, out_len))
        print(f"  sweep {rep + 1}/{repeats} done  {load()}")
    knees = {}
    for name in names:
        med = [{k: statistics.median(r[k] for r in runs[(name, s)]) for k in runs[(name, s)][0]} for s in sweep]
        for s, r in zip(sweep, med):
            print(f"  kv={name:<5} blocks={blocks[name]:>5} max_num_seqs={s:>4}  preemptions={r['preemptions']:>5.0f} "
                  f"({r['preemptions'] / s:.2f}/req)  tpot_p50={r['tpot_p50']:7.1f} ms  "
                  f"tpot_p99={r['tpot_p99']:7.1f} ms  out={r['tok_s']:6.1f} tok/s (wall)  (medians of {repeats})")
        k = find_knee(sweep, [r["preemptions"] / s for r, s in zip(med, sweep)], [r["tpot_p99"] for r in med])
        knees[name] = sweep[k]
        nxt = med[k + 1] if k + 1 < len(sweep) else None
        why = ("no KV pressure in the sweep" if nxt is None else "preemptions start above it"
               if nxt["preemptions"] / sweep[k + 1] > PREEMPTION_TOLERANCE else "TPOT p99 turns up above it")
        print(f"  knee kv={name}: max_num_seqs={sweep[k]} ({why})")
    print(f"  knee: auto at max_num_seqs={knees['auto']}, int8 at {knees['int8']} -> "
          f"{knees['int8'] / knees['auto']:.2f}x further  {load()}")


def _fill_text(base: Engine, n: int) -> list[int]:
    """n token ids of plain text (real KV values, not a zeroed cache)."""
    ids: list[int] = []
    while len(ids) < n:
        ids += base.tokenizer.encode("The harbour master wrote down every boat that came in, its name, its cargo, "
                                     "the weather and the hour, in a ledger that is still kept today. ")
    return ids[:n]


def _decode_executor(base: Engine, name: str, n: int, ctx: int, per: int) -> ModelExecutor:
    """An executor whose n sequences each hold `ctx` tokens of real KV in their own blocks: one
    prefill of `ctx` text tokens, copied to every sequence's blocks by the executor's swap path."""
    ex = executor_for(base.executor.model, EngineConfig.from_kwargs(
        num_kv_blocks=(n + 1) * per, kv_cache_dtype=name).cache)
    src = list(range(n * per, (n + 1) * per))
    params = SamplingParams(max_tokens=1, temperature=0.0)
    ex.execute(SchedulerOutput(0, [ScheduledRequest("fill", _fill_text(base, ctx), 0, src, True, True, True, 0,
                                                    params)], ctx, 0, finished_ids=[]))
    n_ctx = -(-ctx // 16)
    ex.execute(SchedulerOutput(1, [], 0, 0, finished_ids=["fill"], swap_out=[(src[j], j) for j in range(n_ctx)],
                               swap_in=[(j, i * per + j) for i in range(n) for j in range(n_ctx)]))
    return ex


def _decode_out(n: int, ctx: int, per: int) -> SchedulerOutput:
    """One decode token per sequence at position `ctx`: attention reads ctx + 1 tokens of KV each.
    A short one (ctx < 16) runs in each sequence's last block, which the long one reads only at
    offset 0, so it does not overwrite the context."""
    params = SamplingParams(max_tokens=1, temperature=0.0)
    tables = [list(range(i * per, (i + 1) * per)) if ctx >= 16 else [(i + 1) * per - 1] for i in range(n)]
    return SchedulerOutput(2, [ScheduledRequest(f"r{i}", [11], ctx, tables[i], True, True, False, 0, params)
                               for i in range(n)], 0, n)


def decode_step(base: Engine, full: bool, repeats: int = 7) -> None:
    """One decode step of n sequences x ctx context, each executor's KV holding real values; the
    same step at a 16-token context isolates the part that reads the context's KV."""
    n, ctx = (64, 2048) if full else (32, 1024)
    per = -(-(ctx + 1) // 16)
    print(f"== decode step: {n} sequences x {ctx} context (real KV from a prefill, copied to each sequence's own "
          f"blocks), warm-up excluded, median of {repeats} interleaved repeats (order rotated)")
    names = ["auto", "int8", "fp8_e4m3"]
    executors = {name: _decode_executor(base, name, n, ctx, per) for name in names}
    steps = {"long": _decode_out(n, ctx, per), "short": _decode_out(n, 15, per)}
    times: dict[tuple[str, str], list[float]] = {(nm, k): [] for nm in names for k in steps}
    tokens: dict[str, int] = {}
    for rep in range(repeats + 1):   # round 0 warms up
        order = names[rep % len(names):] + names[:rep % len(names)]
        for name in order:
            for kind, out in steps.items():
                t0 = time.perf_counter()
                res = executors[name].execute(out)
                dt = time.perf_counter() - t0
                if rep:
                    times[(name, kind)].append(dt)
                if kind == "long":
                    tokens[name] = res.results["r0"].token_ids[0]
    med = {key: statistics.median(ts) for key, ts in times.items()}
    ref, ref_kv = med[("auto", "long")], med[("auto", "long")] - med[("auto", "short")]
    for name in names:
        kv = med[(name, "long")] - med[(name, "short")]
        print(f"  kv={name:<9} step {med[(name, 'long')] * 1000:7.1f} ms ({med[(name, 'long')] / ref:.2f}x full "
              f"precision)  at 16 context {med[(name, 'short')] * 1000:6.1f} ms  -> context KV read "
              f"{kv * 1000:6.1f} ms ({kv / ref_kv if ref_kv > 0 else float('nan'):.2f}x)  next token "
              f"{tokens[name]}{' (= auto)' if tokens[name] == tokens['auto'] else ''}  {load()}")


def sessions(base: Engine, full: bool) -> None:
    """Multi-turn sessions, round robin, whose contexts total ~4x the device tier; the three
    configurations side by side, each request run on each in turn (order rotated)."""
    n_sessions, turns, device_blocks = (16, 4, 64) if full else (8, 4, 32)
    host_blocks = 8 * device_blocks   # the GPU case: host memory far larger than device memory
    tok = base.tokenizer
    print(f"== sessions: {n_sessions} sessions x {turns} turns, round robin, device tier {device_blocks} blocks "
          f"(x16 tokens); host tier {host_blocks} blocks; the three engines interleaved request by request")
    configs = {"device only": dict(num_kv_blocks=device_blocks),
               "device + host tier": dict(num_kv_blocks=device_blocks, kv_offloading_size=1.0,
                                          num_cpu_blocks=host_blocks),
               "control: one device tier of both sizes": dict(num_kv_blocks=device_blocks + host_blocks)}
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    engines = {label: engine_for(base, **kw) for label, kw in configs.items()}
    first = [list(tok.encode(f"Session {s}: " + " ".join(f"note {s}-{j} about the harbour and its boats."
                                                          for j in range(12)))) for s in range(n_sessions)]
    convs = {label: [list(c) for c in first] for label in configs}
    prompt = dict.fromkeys(configs, 0)
    cached = dict.fromkeys(configs, 0)
    ttfts: dict[str, list[float]] = {label: [] for label in configs}
    labels = list(configs)
    for i, (turn, s) in enumerate((t, s) for t in range(turns) for s in range(n_sessions)):
        for label in labels[i % 3:] + labels[:i % 3]:
            eng, conv = engines[label], convs[label][s]
            conv += tok.encode(f" Question {turn} of session {s}: what did note {turn} say, and why?")
            rid = eng.add_request(list(conv), params)
            out = [o for o in eng.run_until_done() if o.request_id == rid][0]
            prompt[label] += len(conv)
            cached[label] += out.num_cached_tokens
            if out.metrics.ttft is not None:
                ttfts[label].append(out.metrics.ttft)
            conv += out.token_ids
    p50 = {label: statistics.median(ts) for label, ts in ttfts.items()}
    for label, eng in engines.items():
        total_ctx = sum(len(c) for c in convs[label])
        host = eng.snapshot().tiers.get("host", {})
        print(f"  {label:<40} hit_rate={cached[label] / prompt[label]:.3f}  ttft_p50={p50[label] * 1000:7.1f} ms "
              f"({p50[label] / p50['device only']:.2f}x device only)  host promotions={host.get('promotions', 0):>5} "
              f"demotions={host.get('demotions', 0):>5}  contexts total {total_ctx} tokens = "
              f"{total_ctx / (device_blocks * 16):.1f}x device tier  {load()}")
    rate = {label: cached[label] / prompt[label] for label in configs}
    gain = rate["device + host tier"] / rate["device only"] if rate["device only"] else float("inf")
    print(f"  host tier vs device only: hit rate {gain:.2f}x, TTFT p50 "
          f"{p50['device + host tier'] / p50['device only']:.2f}x; vs the control (the tier's overhead): TTFT p50 "
          f"{p50['device + host tier'] / p50['control: one device tier of both sizes']:.2f}x")


def restart(base: Engine, full: bool) -> None:
    """The disk tier: an engine serves a long prompt and shuts down gracefully; a restarted one
    (same directory) serves the same prompt first, beside a cold engine without the directory."""
    n_words = 240 if full else 90
    prompt = list(base.tokenizer.encode(" ".join(f"entry {j}: the boat came in at dawn with fish and salt."
                                                  for j in range(n_words))))
    kw = dict(num_kv_blocks=-(-len(prompt) // 16) + 8, kv_offloading_size=1.0, num_cpu_blocks=4 * len(prompt) // 16)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    print(f"== restart: disk tier (kv_offloading_dir), a {len(prompt)}-token prompt, graceful shutdown, restart")

    def first_request(eng: Engine) -> Any:
        rid = eng.add_request(list(prompt), params)
        return [o for o in eng.run_until_done() if o.request_id == rid][0]

    with tempfile.TemporaryDirectory() as directory:
        eng = engine_for(base, **kw, kv_offloading_dir=directory)
        before = first_request(eng)
        eng.shutdown()
        s = disk_tier_of(eng).index.stats
        print(f"  before: cached_tokens={before.num_cached_tokens}; shutdown wrote {s.written} block files "
              f"({s.bytes_written / 2**20:.1f} MiB)")
        runs: dict[str, Any] = {}
        for label in ("cold engine", "restarted", "cold engine ", "restarted "):   # interleaved twice
            restarted = label.startswith("restarted")
            eng = engine_for(base, **kw, **({"kv_offloading_dir": directory} if restarted else {}))
            runs[label] = (first_request(eng), eng.snapshot().tiers.get("host", {}).get("promotions", 0))
        for label, (out, promotions) in runs.items():
            print(f"  {label.strip():<12} first request: cached_tokens={out.num_cached_tokens:>4} of {len(prompt)}  "
                  f"host promotions={promotions:>3}  ttft={out.metrics.ttft * 1000:7.1f} ms  "
                  f"same tokens as before: {out.token_ids == before.token_ids}  {load()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="full sizes (minutes longer)")
    ap.add_argument("--only", default="capacity,decode,sessions,restart,knee", help="comma list of parts to run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine; the "
                    "knee's CPU clock needs 1)")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)   # type: ignore[union-attr]
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
    if "restart" in parts:
        restart(base, args.full)
    if "knee" in parts:
        knee(base, args.full)


if __name__ == "__main__":
    main()
