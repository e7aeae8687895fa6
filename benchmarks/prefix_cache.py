"""Prefix cache on vs off (and lru vs weighted-lru), side by side in one run, real model.

  python benchmarks/prefix_cache.py [--quick] [--only a,b,c] [--threads 1] [--device cpu]

(a) multi-turn chat: a shared 500-token system prompt, 32 sessions x 4 turns; each turn
    appends ~100 user tokens to the previous prompt and answer. Closed loop: a session sends
    its next turn when the previous answer is complete, `--concurrency` sessions at a time.
(b) agent: a shared 1,500-token tool-definition prefix; agents make short calls whose
    traces grow by the previous call and a tool result.
(c) hot/cold tenants under a KV budget too small for everything (64 blocks of 16): a hot
    tenant cycling over 3 system prompts of 128 tokens amid a cold tenant's bursts (0-4 per
    hot request) of one-off prompts; lru vs weighted-lru (hot weight 8): hot hit rate.

Prints prefill tokens computed, TTFT p50/p99, output throughput and hit rate per run, and
the ratios against the targets: (a) >= 50% fewer prefill tokens and >= 30% lower TTFT p50,
(b) >= 80% fewer prefill tokens, (c) weighted-lru hot hit rate >= 1.5x lru's. Token ids are
random (seeded), so the text is noise but the work is real. Never asserts on time.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.model.runner import executor_for
from pacer.request import SamplingParams

VOCAB = (200, 48000)


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(n)]


@dataclass
class Conversation:
    """A session: a fixed list of turns; each turn's prompt is built from the previous
    prompt and answer by `extend(prompt, answer, turn)`."""

    first: list[int]
    turns: int
    extend: Callable[[list[int], list[int], int], list[int]]
    tenant: str = "default"
    done: int = 0
    prompt: list[int] = field(default_factory=list)


@dataclass
class Result:
    name: str
    wall_s: float
    prefill_tokens: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    ttfts: list[float]
    per_tenant: dict[str, tuple[int, int]]   # tenant -> (cached, prompt) tokens
    stats: dict[str, Any]

    def pct(self, q: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000

    def line(self, label: str) -> str:
        return (f"{label:<28} prefill_tokens={self.prefill_tokens:>7}  ttft_p50={self.pct(0.5):8.1f} ms  "
                f"ttft_p99={self.pct(0.99):8.1f} ms  throughput={self.output_tokens / self.wall_s:7.1f} tok/s  "
                f"hit_rate={self.cached_tokens / max(1, self.prompt_tokens):.2f}  wall={self.wall_s:.1f}s")


def make_engine(base: Engine, **kw: Any) -> Engine:
    """A fresh engine (own KV cache and config) over the already loaded weights."""
    cfg = EngineConfig.from_kwargs(**kw)
    ex = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
    return Engine(cfg, ex, base.tokenizer, ex.num_blocks, base.max_model_len, base.eos_token_ids,
                  vocab_size=base.vocab_size)


def run_closed_loop(engine: Engine, convs: list[Conversation], concurrency: int, max_tokens: int) -> Result:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    queue = list(convs)
    live: dict[str, Conversation] = {}
    prefill = prompt_toks = cached = out_toks = 0
    ttfts: list[float] = []
    per_tenant: dict[str, list[int]] = {}

    def submit(conv: Conversation) -> None:
        rid = engine.add_request(conv.prompt, params, tenant=conv.tenant)
        live[rid] = conv

    for conv in convs:
        conv.prompt = list(conv.first)
    t0 = time.perf_counter()
    while queue and len(live) < concurrency:
        submit(queue.pop(0))
    while live:
        for out in engine.step():
            if not out.finished:
                continue
            conv = live.pop(out.request_id)
            m = out.metrics
            prefill += m.prefill_tokens
            prompt_toks += m.prompt_tokens
            cached += m.cached_tokens
            out_toks += len(out.token_ids)
            if m.ttft is not None:
                ttfts.append(m.ttft)
            tenant = per_tenant.setdefault(conv.tenant, [0, 0])
            tenant[0] += m.cached_tokens
            tenant[1] += m.prompt_tokens
            conv.done += 1
            if conv.done < conv.turns:
                conv.prompt = conv.extend(conv.prompt, out.token_ids, conv.done)
                queue.insert(0, conv)   # a session's next turn goes before new sessions
            while queue and len(live) < concurrency:
                submit(queue.pop(0))
    wall = time.perf_counter() - t0
    return Result("", wall, prefill, prompt_toks, cached, out_toks, ttfts,
                  {k: (v[0], v[1]) for k, v in per_tenant.items()}, engine.snapshot().as_dict())


# ---------------------------------------------------------------------- workloads


def chat_workload(rng: random.Random, sessions: int, turns: int, system_len: int, user_len: int) -> list[Conversation]:
    system = tokens(rng, system_len)

    def extend(prompt: list[int], answer: list[int], turn: int) -> list[int]:
        return prompt + answer + tokens(rng, rng.randint(user_len - 20, user_len + 20))

    return [Conversation(system + tokens(rng, user_len), turns, extend) for _ in range(sessions)]


def agent_workload(rng: random.Random, agents: int, calls: int, tools_len: int) -> list[Conversation]:
    tools = tokens(rng, tools_len)

    def extend(prompt: list[int], answer: list[int], turn: int) -> list[int]:
        return prompt + answer + tokens(rng, rng.randint(20, 60))   # the call, then the tool's result

    return [Conversation(tools + tokens(rng, 40), calls, extend) for _ in range(agents)]


def tenant_mix(rng: random.Random, rounds: int, hot_prompts: int, prefix_len: int, cold_per_round: int) -> list[Conversation]:
    hot = [tokens(rng, prefix_len) for _ in range(hot_prompts)]
    single: Callable[[list[int], list[int], int], list[int]] = lambda p, a, t: p   # noqa: E731
    convs: list[Conversation] = []
    for r in range(rounds):
        convs.append(Conversation(hot[r % hot_prompts] + tokens(rng, 16), 1, single, tenant="hot"))
        burst = rng.randint(0, 2 * cold_per_round)      # the cold tenant is bursty
        convs.extend(Conversation(tokens(rng, prefix_len + 16), 1, single, tenant="cold")
                     for _ in range(burst))
    return convs


# ---------------------------------------------------------------------- report


def reduction(on: float, off: float) -> float:
    return 1.0 - on / off if off else 0.0


def compare(tag: str, base: Engine, make_convs: Callable[[], list[Conversation]], concurrency: int,
            max_tokens: int) -> tuple[Result, Result]:
    results = {}
    for mode in ("off", "on"):
        engine = make_engine(base, enable_prefix_caching=mode == "on", kv_cache_memory="1GiB")
        results[mode] = run_closed_loop(engine, make_convs(), concurrency, max_tokens)
        print(results[mode].line(f"{tag} cache={mode}"), flush=True)
    return results["off"], results["on"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a quarter of the sessions/rounds (smoke run)")
    ap.add_argument("--only", default="a,b,c", help="which scenarios: a,b,c")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy CPU)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    only = set(args.only.split(","))
    q = 4 if args.quick else 1
    base = Engine.from_kwargs(num_kv_blocks=16, num_threads=args.threads, device=args.device)
    print(f"pacer prefix-cache benchmark: SmolLM2-135M on {args.device}, {args.threads} thread(s), "
          f"concurrency {args.concurrency}{' (quick)' if args.quick else ''}", flush=True)

    if "a" in only:
        sessions = 32 // q

        def chat() -> list[Conversation]:
            return chat_workload(random.Random(args.seed), sessions, 4, 500, 100)

        off, on = compare(f"(a) chat {sessions}x4", base, chat, args.concurrency, 32)
        print(f"(a) on vs off: prefill tokens -{reduction(on.prefill_tokens, off.prefill_tokens):.0%} "
              f"(target >= 50%), TTFT p50 -{reduction(on.pct(0.5), off.pct(0.5)):.0%} (target >= 30%), "
              f"TTFT p99 -{reduction(on.pct(0.99), off.pct(0.99)):.0%}, throughput "
              f"x{(on.output_tokens / on.wall_s) / (off.output_tokens / off.wall_s):.2f}", flush=True)

    if "b" in only:
        agents = 8 // max(1, q // 2)

        def agent() -> list[Conversation]:
            return agent_workload(random.Random(args.seed + 1), agents, 6, 1500)

        off, on = compare(f"(b) agent {agents}x6", base, agent, args.concurrency, 16)
        print(f"(b) on vs off: prefill tokens -{reduction(on.prefill_tokens, off.prefill_tokens):.0%} "
              f"(target >= 80%), TTFT p50 -{reduction(on.pct(0.5), off.pct(0.5)):.0%}, throughput "
              f"x{(on.output_tokens / on.wall_s) / (off.output_tokens / off.wall_s):.2f}", flush=True)

    if "c" in only:
        rounds = 32 // max(1, q // 2)
        hit: dict[str, float] = {}
        for policy in ("lru", "weighted-lru"):
            kw: dict[str, Any] = {"eviction_policy": policy, "num_kv_blocks": 64, "block_size": 16}
            if policy == "weighted-lru":
                kw["tenant_weights"] = {"hot": 8.0}
            engine = make_engine(base, **kw)
            convs = tenant_mix(random.Random(args.seed + 2), rounds, 3, 128, 2)
            res = run_closed_loop(engine, convs, 2, 4)
            cached, prompt = res.per_tenant["hot"]
            hit[policy] = cached / prompt
            cold_c, cold_p = res.per_tenant["cold"]
            print(res.line(f"(c) tenants {policy}") + f"  hot_hit_rate={hit[policy]:.2f}  "
                  f"cold_hit_rate={cold_c / cold_p:.2f}  evicted={res.stats['evicted_blocks']['capacity']}",
                  flush=True)
        ratio = hit["weighted-lru"] / hit["lru"] if hit["lru"] else float("inf")
        print(f"(c) weighted-lru vs lru: hot tenant hit rate {hit['weighted-lru']:.2f} vs {hit['lru']:.2f} = "
              f"x{ratio:.2f} (target >= 1.5x)", flush=True)


if __name__ == "__main__":
    main()
