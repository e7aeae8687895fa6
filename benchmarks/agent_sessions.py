"""Agent sessions (issue 30): keep a conversation's KV while its tool runs, vs LRU and TTL.

Agent loops (`pacer.workload.agents`): N agents, each looping call -> tool -> call over a
growing history, closed loop, so job completion time (JCT) is the result; a chat tenant sends
independent requests on the same engine. Three KV policies, side by side in one run:

- retention: LRU plus session retention windows (`pacer.kv.retention`, the default);
- lru: the same calls without sessions (plain LRU eviction);
- ttl: pacer's ttl policy (LRU plus idle expiry at `cache_ttl`), without sessions.

Real engine: the default model on CPU, KV sized to hold about a third of the agents' final
histories, at most `--max-num-seqs` calls running at once (default 3: a 2-core server's batch;
the rest wait in the queue, where their histories are what retention keeps). Then the
simulator: its prediction of the same real run (cpu-local profile), the same run with the
running batch unbounded (every returned agent admitted at once, so the running calls hold the
KV and there is little left to retain), and H200 + llama-3.1-8b with 256 agents (KV sized to a
third of their histories the same way).

Run: PYTHONPATH=src python benchmarks/agent_sessions.py [--quick] [--skip-real] [--max-num-seqs 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import time
from typing import Any

from pacer.config import EngineConfig
from pacer.workload.agents import AgentLoop, AgentLoopResult, run_agent_loop

POLICIES = {   # name -> (engine kwargs, send sessions)
    "retention": ({"eviction_policy": "lru", "session_retention": True}, True),
    "lru": ({"eviction_policy": "lru", "session_retention": False}, False),
    "ttl": ({"eviction_policy": "ttl", "session_retention": False}, False),
}
BLOCK = 16


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    return ",".join(x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "fma") if x in flags) or "none"


def loadavg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def kv_blocks_for(loop: AgentLoop, fraction: float = 1 / 3) -> int:
    """Blocks holding `fraction` of the agents' final histories (at least one history plus room)."""
    per_agent = -(-loop.max_history() // BLOCK)
    return max(int(loop.num_agents * per_agent * fraction), per_agent + 8)


def policy_kwargs(name: str, loop: AgentLoop) -> dict[str, Any]:
    kw = dict(POLICIES[name][0])
    if name == "ttl":
        kw["cache_ttl"] = max(0.5, 2 * loop.tool_latency)   # idle history expires while a slow tool runs
    return kw


def table(title: str, results: dict[str, AgentLoopResult], extra: str = "") -> None:
    print(f"\n{title}  {extra}")
    print(f"{'policy':<10} {'JCT p50 s':>10} {'JCT mean s':>11} {'follow-up TTFT p50 ms':>22} "
          f"{'chat TTFT p99 ms':>17} {'follow-up hit':>14} {'retention hits':>15}")
    for name, r in results.items():
        row = r.row()
        print(f"{name:<10} {row['jct_p50']:>10.3f} {row['jct_mean']:>11.3f} {row['followup_ttft_p50'] * 1e3:>22.1f} "
              f"{row['chat_ttft_p99'] * 1e3:>17.1f} {row['followup_hit']:>14.0%} {int(row['retention_hit_tokens']):>15}")
    ret, lru, ttl = (results[k].row() for k in ("retention", "lru", "ttl"))
    print(f"retention vs lru: JCT {lru['jct_p50'] / ret['jct_p50']:.2f}x faster (p50), follow-up TTFT "
          f"{lru['followup_ttft_p50'] / ret['followup_ttft_p50']:.2f}x; vs ttl: JCT "
          f"{ttl['jct_p50'] / ret['jct_p50']:.2f}x; chat TTFT p99 retention/lru "
          f"{ret['chat_ttft_p99'] / lru['chat_ttft_p99']:.2f} (target <= 1.10)")
    stats = results["retention"].retention
    print(f"retention counters: opened {stats.get('windows_opened')}, returns {stats.get('returns')}, "
          f"expiries {stats.get('expiries')}, capped {stats.get('capped')}, demoted blocks {stats.get('demoted_blocks')}")


def run_real(loop: AgentLoop, engine_kw: dict[str, Any]) -> dict[str, AgentLoopResult]:
    from pacer.engine import Engine
    from pacer.model.runner import executor_for

    base = Engine.from_kwargs(num_kv_blocks=64, num_threads=max(1, (os.cpu_count() or 2) // 2))
    blocks = kv_blocks_for(loop)
    results = {}
    for name in POLICIES:
        cfg = EngineConfig.from_kwargs(num_kv_blocks=blocks, **policy_kwargs(name, loop), **engine_kw)
        ex = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
        engine = Engine(cfg, ex, base.tokenizer, ex.num_blocks, base.max_model_len, base.eos_token_ids,
                        vocab_size=base.vocab_size)
        run_agent_loop(engine, dataclasses.replace(loop, num_agents=1, turns=2, chat_rate=0), sessions=False)  # warm
        results[name] = run_agent_loop(engine, loop, sessions=POLICIES[name][1])
        print(f"  real {name}: {results[name].wall:.1f} s wall, load {loadavg()}", flush=True)
    return results


def run_sim(loop: AgentLoop, hardware: str, model: str, blocks: int | None = None,
            engine_kw: dict[str, Any] | None = None) -> dict[str, AgentLoopResult]:
    from pacer.perf.profiles import get_hardware, get_model
    from pacer.sim.simulator import build_sim_engine

    results = {}
    for name in POLICIES:
        kw = policy_kwargs(name, loop)
        cfg = EngineConfig.from_kwargs(num_kv_blocks=blocks or kv_blocks_for(loop), **kw, **(engine_kw or {}))
        engine, _, _ = build_sim_engine(cfg, get_hardware(hardware), get_model(model), keep_records=False)
        results[name] = run_agent_loop(engine, loop, sessions=POLICIES[name][1])
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer agents and turns (a smoke run)")
    ap.add_argument("--skip-real", action="store_true", help="only the simulated tables")
    ap.add_argument("--sim-agents", type=int, default=256, help="agents in the simulated H200 run")
    ap.add_argument("--max-num-seqs", type=int, default=3,
                    help="calls running at once in the real run and its prediction (default 3)")
    args = ap.parse_args()
    print(f"agent_sessions  {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC  load {loadavg()}  "
          f"cpu flags {cpu_flags()}  cores {os.cpu_count()}")
    real_loop = AgentLoop(num_agents=6 if args.quick else 16, turns=3 if args.quick else 6, system_len=256,
                          task_len=64, tool_output_len=64, output_len=4, tool_latency=0.5,
                          tool_latency_dist="lognormal", chat_rate=0.5, chat_prompt_len=64, chat_output_len=4)
    engine_kw = {"max_num_seqs": args.max_num_seqs}
    print(f"real workload: {real_loop.num_agents} agents x {real_loop.turns} calls (shared system prompt "
          f"{real_loop.system_len} tokens), tool {real_loop.tool_latency}s ({real_loop.tool_latency_dist}), final "
          f"history {real_loop.max_history()} tokens, KV {kv_blocks_for(real_loop)} blocks (~1/3 of the histories), "
          f"at most {args.max_num_seqs} calls running, chat {real_loop.chat_rate}/s")
    t = time.perf_counter()
    predicted = run_sim(real_loop, "cpu-local", "smollm2-135m", engine_kw=engine_kw)
    table("simulator's prediction of the real run (cpu-local, smollm2-135m)", predicted)
    unbounded = run_sim(real_loop, "cpu-local", "smollm2-135m")
    table("the same, simulated with the running batch unbounded (max_num_seqs 256)", unbounded)
    if not args.skip_real:
        real = run_real(real_loop, engine_kw)
        table("real engine (smollm2-135m, CPU)", real, f"load {loadavg()}  cpu flags {cpu_flags()}")
    big = AgentLoop(num_agents=args.sim_agents, turns=4 if args.quick else 8, system_len=1024, task_len=512,
                    tool_output_len=1024, output_len=64, tool_latency=2.0, tool_latency_dist="lognormal",
                    chat_rate=4.0, chat_prompt_len=1024, chat_output_len=128)
    h200_blocks = kv_blocks_for(big)
    sim = run_sim(big, "h200-sxm", "llama-3.1-8b", h200_blocks)
    table(f"simulated h200-sxm + llama-3.1-8b, {big.num_agents} agents x {big.turns} calls, KV {h200_blocks} "
          f"blocks (~1/3 of the histories)", sim)
    print(f"\ntotal {time.perf_counter() - t:.0f} s, load {loadavg()}")


if __name__ == "__main__":
    main()
