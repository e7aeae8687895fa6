"""Routing evidence: prefix-aware routing vs round-robin and least-loaded, real and simulated.

One command (`python benchmarks/routing.py`; `--quick` for a smaller run):

(a) On this machine: 2 real SmolLM2-135M engines (one torch thread each, each with a KV
    budget that holds a third of the 8 system prompts plus its running requests' own blocks),
    behind pacer's routers (`pacer.deploy.routers`, the code Ray Serve runs), fed a
    multi-tenant chat trace: 8 system prompts of ~600 tokens with Zipf popularity (exponent 0.6
    by default, `--zipf`) and a short user turn each, 4 clients in a closed loop; `--repeats K`
    routes K fresh traces. The prefix router reads the engines' own KV events. Per router:
    prefix-cache hit rate, TTFT p50/p99, output throughput and the load split, and the
    simulator's prediction of the same run (2 simulated engines, the same closed loop).
(b) The simulator with 16 replicas (H200, Llama-3.1-8B, one virtual timeline): the same
    comparison at one rate, and the highest rate at which each router holds a TTFT p99 target.

Targets (issue 15): prefix hit rate >= 1.5x round-robin's, lower TTFT p50, load split no worse
than 60/40. Times on the shared 2-core machine are noisy: compare ratios, note the load average.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pacer.deploy.kv_index import BlockIndex  # noqa: E402
from pacer.deploy.routers import Cluster, PrefixRouter, RouteRequest, make_router  # noqa: E402
from pacer.kv.events import BlockEvent  # noqa: E402

ROUTER_NAMES = ("round-robin", "least-loaded", "prefix")


def load() -> str:
    return "load avg " + "/".join(f"{x:.1f}" for x in os.getloadavg())


def make_trace(n: int, vocab: int, seed: int, num_prompts: int = 8, prompt_len: int = 600,
               user_len: int = 40, num_tenants: int = 4, source=None, zipf: float = 1.0) -> list[tuple[str, list[int]]]:
    """(tenant, token ids) per request: a system prompt by Zipf popularity (prompt k's weight
    1 / (k + 1) ** zipf) + a fresh user turn."""
    rng = random.Random(seed)
    if source is not None:
        systems = [list(source.segment(prompt_len, rng).token_ids) for _ in range(num_prompts)]
    else:
        systems = [[rng.randrange(10, vocab) for _ in range(prompt_len)] for _ in range(num_prompts)]
    weights = [1.0 / (k + 1) ** zipf for k in range(num_prompts)]
    out = []
    for _ in range(n):
        k = rng.choices(range(num_prompts), weights)[0]
        user = list(source.segment(user_len, rng).token_ids) if source is not None else [
            rng.randrange(10, vocab) for _ in range(user_len)]
        out.append((f"tenant-{rng.randrange(num_tenants)}", systems[k] + user))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


# ---------------------------------------------------------------------- (a) real engines

class EngineWorker:
    """One engine stepped by its own thread; finished outputs go to a shared queue."""

    def __init__(self, engine, name: str, done: queue.Queue) -> None:
        self.engine, self.name, self.done = engine, name, done
        self.wake = threading.Event()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            if not self.engine.has_unfinished_requests():
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            for out in self.engine.step():
                if out.finished:
                    self.done.put((self.name, out))


def run_real(args: argparse.Namespace) -> None:
    from pacer.engine import Engine
    from pacer.request import SamplingParams
    from pacer.workload.text import TextSource

    engines = [Engine.from_kwargs(num_kv_blocks=args.kv_blocks, num_threads=1, max_model_len=2048,
                                  max_num_seqs=args.concurrency) for _ in range(2)]
    source = TextSource(engines[0].tokenizer)
    lock = threading.Lock()
    index = BlockIndex()
    for i, e in enumerate(engines):
        def sink(now: float, events: list[BlockEvent], rid: str = f"replica-{i}") -> None:
            with lock:
                index.apply(rid, events)
        e.add_kv_event_sink(sink)
    done: queue.Queue = queue.Queue()
    workers = [EngineWorker(e, f"replica-{i}", done) for i, e in enumerate(engines)]
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
    # warm-up: kernels and allocator, outside the measurement
    for w in workers:
        w.engine.add_request(list(source.segment(64, random.Random(0)).token_ids), params)
        w.wake.set()
    for _ in workers:
        done.get()
    print(f"(a) 2 real engines, {args.num_requests} requests, concurrency {args.concurrency}, "
          f"{args.kv_blocks} KV blocks each, {args.output_len} output tokens, Zipf {args.zipf:g} popularity, prefix "
          f"balance thresholds abs {args.balance_abs_threshold} rel {args.balance_rel_threshold:g}, "
          f"{args.repeats} repeat(s) of a fresh trace each ({load()})", flush=True)
    runs = []
    for k in range(args.repeats):   # each repeat a new trace (seed + k): the ratio's spread over traces
        trace = make_trace(args.num_requests, engines[0].vocab_size or 1000, args.seed + k, source=source,
                           zipf=args.zipf)
        results = {}
        for name in [r for r in ROUTER_NAMES if r in args.routers]:
            for e in engines:   # every router starts cold (and its index hears of it before routing)
                e.run_until_done()
                e.reset_prefix_cache()
            r = results[name] = _run_router(name, engines, workers, done, trace, params, index, lock, args)
            print(f"(a) seed {args.seed + k} router={name:12s} hit_rate={r['hit_rate']:.3f} "
                  f"ttft_p50={r['ttft_p50'] * 1000:7.1f} ms ttft_p99={r['ttft_p99'] * 1000:7.1f} ms "
                  f"throughput={r['tok_s']:6.1f} tok/s split={r['split']}{r['moves']} wall={r['wall']:.1f}s ({load()})",
                  flush=True)
        if "round-robin" in results and "prefix" in results:
            _summary(f"(a) seed {args.seed + k}", results)
            runs.append(results)
        sim = {name: _simulate_real(name, trace, args) for name in results}
        print(f"(a) seed {args.seed + k} the simulator's closed-loop prediction (cpu-local): " + ", ".join(
            f"{name} hit rate {h:.3f} split {split}" for name, (h, split) in sim.items()), flush=True)
    for w in workers:
        w.stop = True
    if len(runs) > 1:
        ratios = [r["prefix"]["hit_rate"] / max(r["round-robin"]["hit_rate"], 1e-9) for r in runs]
        print(f"(a) over {len(runs)} traces: prefix / round-robin hit rate mean x{statistics.mean(ratios):.2f} "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f}); TTFT p50 lower in "
              f"{sum(r['prefix']['ttft_p50'] < r['round-robin']['ttft_p50'] for r in runs)}/{len(runs)}; "
              f"busiest replica at most {max(r['prefix']['max_share'] for r in runs) * 100:.0f}%")


def _run_router(name, engines, workers, done, trace, params, index, lock, args) -> dict:
    router = make_router(name, len(engines), balance_abs_threshold=args.balance_abs_threshold,
                         balance_rel_threshold=args.balance_rel_threshold)
    concurrency = args.concurrency
    ids = [w.name for w in workers]
    cluster = Cluster(ids, {i: 0 for i in ids}, index, engines[0].config.cache.block_size)
    before = [(s.prefix_cache_hit_tokens, s.prefix_cache_queried_tokens) for s in (e.snapshot() for e in engines)]
    routed = {i: 0 for i in ids}
    ttfts, out_tokens, nxt, in_flight = [], 0, 0, 0
    t0 = time.perf_counter()
    while nxt < len(trace) or in_flight:
        while nxt < len(trace) and in_flight < concurrency:
            tenant, tokens = trace[nxt]
            with lock:
                choice = router.choose(RouteRequest(f"r{nxt}", tokens, tenant), cluster)
            w = workers[ids.index(choice)]
            w.engine.add_request(tokens, params, tenant=tenant)
            w.wake.set()
            cluster.load[choice] += 1
            routed[choice] += 1
            in_flight += 1
            nxt += 1
        replica, out = done.get()
        cluster.load[replica] -= 1
        in_flight -= 1
        ttfts.append(out.metrics.ttft)
        out_tokens += len(out.token_ids)
    wall = time.perf_counter() - t0
    after = [e.snapshot() for e in engines]   # every request is done: the engines are idle
    hits = sum(s.prefix_cache_hit_tokens - b[0] for s, b in zip(after, before))
    queried = sum(s.prefix_cache_queried_tokens - b[1] for s, b in zip(after, before))
    total = sum(routed.values())
    return {"hit_rate": hits / max(queried, 1), "ttft_p50": statistics.median(ttfts), "ttft_p99": pct(ttfts, 99),
            "tok_s": out_tokens / wall, "wall": wall,
            "split": "/".join(f"{routed[i] * 100 // total}" for i in ids), "max_share": max(routed.values()) / total,
            "moves": (f" rehomed={router.num_rehomed} detours={router.num_balanced}"
                      if isinstance(router, PrefixRouter) else "")}


def _simulate_real(name: str, trace: list[tuple[str, list[int]]], args: argparse.Namespace) -> tuple[float, str]:
    """Part (a)'s run on the simulator: 2 simulated SmolLM2 engines (cpu-local) with the same KV
    budget behind the same router, the same trace, a closed loop of the same clients."""
    from pacer.config import EngineConfig
    from pacer.perf.profiles import get_hardware, get_model
    from pacer.sim.cluster import build_cluster, simulate_cluster
    from pacer.sim.simulator import SimRequest

    config = EngineConfig.from_kwargs(num_kv_blocks=args.kv_blocks, block_size=16, max_model_len=2048,
                                      max_num_seqs=args.concurrency)
    index = BlockIndex()
    replicas = build_cluster(2, config, get_hardware("cpu-local"), get_model("smollm2-135m"), index)
    reqs = [SimRequest(f"q{i}", None, tokens, args.output_len, tenant=t) for i, (t, tokens) in enumerate(trace)]
    router = make_router(name, 2, balance_abs_threshold=args.balance_abs_threshold,
                         balance_rel_threshold=args.balance_rel_threshold)
    res = simulate_cluster(replicas, router, index, reqs, block_size=16, concurrency=args.concurrency)
    return res.hit_rate(), "/".join(f"{x * 100:.0f}" for x in res.load_split())


def _summary(tag: str, r: dict) -> None:
    rr, p = r["round-robin"], r["prefix"]
    print(f"{tag} prefix vs round-robin: hit rate x{p['hit_rate'] / max(rr['hit_rate'], 1e-9):.2f} (target >= 1.5), "
          f"TTFT p50 {p['ttft_p50'] * 1000:.1f} vs {rr['ttft_p50'] * 1000:.1f} ms ({'lower' if p['ttft_p50'] < rr['ttft_p50'] else 'NOT lower'}), "
          f"load split {p['split']} (target no worse than 60/40: {'ok' if p['max_share'] <= 0.6 else 'missed'})")


# ---------------------------------------------------------------------- (b) simulator, 16 replicas

def run_sim(args: argparse.Namespace) -> None:
    from pacer.config import EngineConfig
    from pacer.perf.profiles import get_hardware, get_model
    from pacer.sim.cluster import build_cluster, simulate_cluster
    from pacer.sim.simulator import SimRequest

    hw, model = get_hardware("h200-sxm"), get_model("llama-3.1-8b")
    config = EngineConfig.from_kwargs(num_kv_blocks=args.sim_kv_blocks, block_size=16, max_model_len=4096,
                                      max_num_seqs=64)

    def once(name: str, rate: float, n: int) -> dict:
        rng = random.Random(args.seed)
        trace = make_trace(n, model.vocab_size, args.seed, num_prompts=args.sim_prompts)
        t, reqs = 0.0, []
        for i, (tenant, tokens) in enumerate(trace):
            t += rng.expovariate(rate)
            reqs.append(SimRequest(f"q{i}", t, tokens, args.sim_output_len, tenant=tenant))
        index = BlockIndex()
        replicas = build_cluster(args.sim_replicas, config, hw, model, index)
        res = simulate_cluster(replicas, make_router(name, args.sim_replicas), index, reqs, block_size=16)
        ttft = [r.ttft for r in res.records if r.ttft is not None]
        out = sum(r.output_tokens for r in res.records)
        split = res.load_split()
        return {"hit_rate": res.hit_rate(), "ttft_p50": statistics.median(ttft), "ttft_p99": pct(ttft, 99),
                "tok_s": out / res.sim_duration_s, "max_share": max(split),
                "split": f"max {max(split) * 100:.1f}% / min {min(split) * 100:.1f}%", "wall": res.wall_s}

    print(f"(b) simulator: {args.sim_replicas} x {model.name} on {hw.name}, {args.sim_prompts} system prompts of 600 "
          f"tokens, {args.sim_kv_blocks} KV blocks per replica, {args.sim_requests} requests at {args.sim_rate:g} req/s")
    results = {}
    for name in ROUTER_NAMES:
        r = results[name] = once(name, args.sim_rate, args.sim_requests)
        print(f"(b) router={name:12s} hit_rate={r['hit_rate']:.3f} ttft_p50={r['ttft_p50'] * 1000:7.1f} ms "
              f"ttft_p99={r['ttft_p99'] * 1000:7.1f} ms throughput={r['tok_s']:8.1f} tok/s split={r['split']} "
              f"wall={r['wall']:.1f}s")
    r16 = {k: dict(v, split=v["split"]) for k, v in results.items()}
    rr, p = r16["round-robin"], r16["prefix"]
    print(f"(b) prefix vs round-robin: hit rate x{p['hit_rate'] / max(rr['hit_rate'], 1e-9):.2f}, TTFT p50 "
          f"{p['ttft_p50'] * 1000:.1f} vs {rr['ttft_p50'] * 1000:.1f} ms, busiest replica {p['max_share'] * 100:.1f}% "
          f"(even: {100 / args.sim_replicas:.1f}%)")
    rates = [args.sim_rate * f for f in (1, 2, 4, 8)]
    for name in ROUTER_NAMES:
        held = [rate for rate in rates if once(name, rate, args.sim_requests)["ttft_p99"] <= args.ttft_p99_target]
        best = f"{max(held):g} req/s" if held else f"none of {rates[0]:g}..{rates[-1]:g}"
        print(f"(b) router={name:12s} highest rate holding TTFT p99 <= {args.ttft_p99_target * 1000:.0f} ms: {best} "
              f"(tried {', '.join(f'{x:g}' for x in rates)})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller runs (for a smoke test)")
    p.add_argument("--skip-real", action="store_true", help="only the simulator part")
    p.add_argument("--skip-sim", action="store_true", help="only the real-engine part")
    p.add_argument("--num-requests", type=int, default=192)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--kv-blocks", type=int, default=110,
                   help="per real engine: a third of the 8 prompts (300 blocks in all) plus the running requests' "
                        "own blocks (~4 each)")
    p.add_argument("--repeats", type=int, default=1, help="real part: traces (seed, seed + 1, ...), each routed by "
                                                          "every router")
    p.add_argument("--routers", default=",".join(ROUTER_NAMES), help="real part: routers to compare")
    p.add_argument("--balance-abs-threshold", type=int, default=4,
                   help="prefix router (as pacer serve's flag); at concurrency 4 over 2 replicas loads never "
                        "differ by more than 4, so 4 never balances and 2 balances often")
    p.add_argument("--balance-rel-threshold", type=float, default=1.5, help="prefix router (as pacer serve's flag)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--zipf", type=float, default=0.6, help="popularity skew of the system prompts (Zipf exponent; "
                                                             "at 1.0 the top two prompts take 55%% of the traffic)")
    p.add_argument("--sim-replicas", type=int, default=16)
    p.add_argument("--sim-prompts", type=int, default=8)
    p.add_argument("--sim-requests", type=int, default=2000)
    p.add_argument("--sim-rate", type=float, default=160.0)
    p.add_argument("--sim-output-len", type=int, default=64)
    p.add_argument("--sim-kv-blocks", type=int, default=160,
                   help="per simulated replica: ~1/3 of the 8 prompts beside the running requests")
    p.add_argument("--ttft-p99-target", type=float, default=0.25, help="seconds")
    args = p.parse_args()
    args.routers = [r for r in args.routers.split(",") if r]
    if args.quick:
        args.num_requests, args.sim_requests = 16, 600
    t = time.perf_counter()
    if not args.skip_real:
        run_real(args)
    if not args.skip_sim:
        run_sim(args)
    print(f"total wall {time.perf_counter() - t:.0f}s ({load()})")


if __name__ == "__main__":
    main()
