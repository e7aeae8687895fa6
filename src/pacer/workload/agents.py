"""The agent-loop workload (`--workload agent-loop`): N concurrent agents, each looping call ->
tool -> call over a growing history, with closed-loop clients, so job completion time is a
result. Runs an in-process `Engine` on its own clock: the wall clock (the real engine) or a
virtual one (`pacer sim`), through the same loop.

An agent's job is `turns` calls. Call k's prompt is the conversation so far: a system prompt
(shared by all agents), the task, and for each earlier call its generated tokens plus the
tool's answer (`tool_output_len` tokens). Between calls the tool runs for a latency drawn from
`tool_latency` (exponential, log-normal or fixed around its mean). Each call names its agent's
session, so the engine may retain the history while the tool runs (`pacer.kv.retention`). An
optional chat tenant sends independent requests at a Poisson rate on the same engine.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pacer.request import SamplingParams

if TYPE_CHECKING:
    from pacer.engine import Engine

__all__ = ["AgentLoop", "AgentLoopResult", "run_agent_loop", "TOOL_LATENCY_DISTRIBUTIONS"]

TOOL_LATENCY_DISTRIBUTIONS = ("exponential", "lognormal", "fixed")


@dataclass(frozen=True, slots=True)
class AgentLoop:
    num_agents: int = 8
    turns: int = 6                    # calls per job
    system_len: int = 64              # shared system prompt (tool definitions), tokens
    task_len: int = 48                # each agent's task, tokens
    tool_output_len: int = 96         # a tool's answer appended to the history, tokens
    output_len: int = 8               # tokens per call (the tool call)
    tool_latency: float = 1.0         # mean seconds a tool runs
    tool_latency_dist: str = "exponential"
    chat_rate: float = 0.0            # requests/s of a chat tenant sharing the engine (0: none)
    chat_prompt_len: int = 128
    chat_output_len: int = 8
    vocab: tuple[int, int] = (100, 20000)   # token ids drawn from this range
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_agents", "turns", "output_len", "chat_prompt_len", "chat_output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent-loop {name} must be >= 1, got {getattr(self, name)}")
        if self.tool_latency < 0 or self.chat_rate < 0:
            raise ValueError("agent-loop tool_latency and chat_rate must be >= 0")
        if self.tool_latency_dist not in TOOL_LATENCY_DISTRIBUTIONS:
            raise ValueError(f"agent-loop tool_latency_dist must be one of {', '.join(TOOL_LATENCY_DISTRIBUTIONS)}, "
                             f"got {self.tool_latency_dist!r}")

    def max_history(self) -> int:
        """Tokens of a job's last call (what its KV must hold at the end)."""
        return (self.system_len + self.task_len + (self.turns - 1) * (self.output_len + self.tool_output_len)
                + self.output_len)

    def draw_latency(self, rng: random.Random) -> float:
        mean = self.tool_latency
        if self.tool_latency_dist == "fixed" or mean == 0:
            return mean
        if self.tool_latency_dist == "exponential":
            return rng.expovariate(1.0 / mean)
        sigma = 0.5
        return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


@dataclass(slots=True)
class AgentLoopResult:
    job_times: list[float] = field(default_factory=list)       # per agent: first call sent -> last call done, s
    followup_ttfts: list[float] = field(default_factory=list)  # calls after the first: TTFT, s
    first_ttfts: list[float] = field(default_factory=list)
    chat_ttfts: list[float] = field(default_factory=list)
    followup_prompt_tokens: int = 0
    followup_cached_tokens: int = 0
    retention_hit_tokens: int = 0
    retention: dict[str, int] = field(default_factory=dict)    # the engine's session retention counters
    wall: float = 0.0

    @staticmethod
    def pct(values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        s = sorted(values)
        return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]

    def row(self) -> dict[str, float]:
        """The figures a report prints: p50 job completion and follow-up TTFT, chat TTFT p99, hit share."""
        return {"jct_p50": self.pct(self.job_times, 50), "jct_mean": statistics.fmean(self.job_times)
                if self.job_times else float("nan"),
                "followup_ttft_p50": self.pct(self.followup_ttfts, 50),
                "chat_ttft_p99": self.pct(self.chat_ttfts, 99),
                "followup_hit": self.followup_cached_tokens / max(1, self.followup_prompt_tokens),
                "retention_hit_tokens": float(self.retention_hit_tokens)}


@dataclass(slots=True)
class _Agent:
    name: str
    history: list[int]
    turn: int = 0
    started: float = 0.0


def _tokens(rng: random.Random, n: int, vocab: tuple[int, int]) -> list[int]:
    return [rng.randrange(*vocab) for _ in range(n)]


def _events(loop: AgentLoop, rng: random.Random, t0: float) -> Iterator[float]:
    """Chat arrival times (a Poisson process)."""
    t = t0
    while loop.chat_rate > 0:
        t += rng.expovariate(loop.chat_rate)
        yield t


def run_agent_loop(engine: Engine, loop: AgentLoop, *, sessions: bool = True) -> AgentLoopResult:
    """Run every agent's job to completion on `engine` (its clock: wall or virtual); `sessions`
    False sends the same calls without naming a session (no retention hints)."""
    rng = random.Random(loop.seed)
    clock = engine.clock
    t0 = clock.now()
    system = _tokens(rng, loop.system_len, loop.vocab)
    agents = [_Agent(f"agent-{i}", system + _tokens(rng, loop.task_len, loop.vocab), started=t0)
              for i in range(loop.num_agents)]
    due: list[tuple[float, int]] = [(t0, i) for i in range(loop.num_agents)]   # (send time, agent)
    chats = _events(loop, random.Random(loop.seed + 1), t0)
    next_chat = next(chats, math.inf)
    in_flight: dict[str, tuple[str, int]] = {}   # request id -> ("agent", i) | ("chat", 0)
    result = AgentLoopResult()
    params = SamplingParams(max_tokens=loop.output_len, temperature=0.0, ignore_eos=True)
    chat_params = SamplingParams(max_tokens=loop.chat_output_len, temperature=0.0, ignore_eos=True)
    done = 0
    while done < loop.num_agents:
        now = clock.now()
        while due and due[0][0] <= now:
            _, i = heapq.heappop(due)
            a = agents[i]
            rid = engine.add_request(list(a.history), params, tenant="agents", arrival_time=now,
                                     session=a.name if sessions else None)
            in_flight[rid] = ("agent", i)
        while next_chat <= now:
            rid = engine.add_request(_tokens(rng, loop.chat_prompt_len, loop.vocab), chat_params, tenant="chat",
                                     arrival_time=next_chat)
            in_flight[rid] = ("chat", 0)
            next_chat = next(chats, math.inf)
        if engine.has_unfinished_requests():
            for out in engine.step():
                if not out.finished:
                    continue
                kind, i = in_flight.pop(out.request_id)
                m = out.metrics
                if kind == "chat":
                    if m.ttft is not None:
                        result.chat_ttfts.append(m.ttft)
                    continue
                ended = _agent_finished(loop, agents[i], out, rng, clock.now(), due, i, result)
                if ended and sessions:   # the job's last call answers (no tool runs): as served, its window closes
                    engine.session_answered("agents", agents[i].name)
                done += ended
            continue
        wake = min(due[0][0] if due else math.inf, next_chat)
        clock.wait_until(wake)
    result.wall = clock.now() - t0
    while engine.has_unfinished_requests():   # the last calls' answered notes, applied at a step
        engine.step()
    result.retention = dict(engine.snapshot().retention)
    return result


def _agent_finished(loop: AgentLoop, a: _Agent, out: Any, rng: random.Random, now: float,
                    due: list[tuple[float, int]], i: int, result: AgentLoopResult) -> int:
    """Record a finished call; queue the agent's next call after its tool, or end its job (returns 1)."""
    m = out.metrics
    if a.turn == 0:
        result.first_ttfts.append(m.ttft)
    else:
        result.followup_ttfts.append(m.ttft)
        result.followup_prompt_tokens += m.prompt_tokens
        result.followup_cached_tokens += m.cached_tokens
        result.retention_hit_tokens += m.retention_hit_tokens
    a.turn += 1
    if a.turn >= loop.turns:
        result.job_times.append(now - a.started)
        return 1
    a.history += list(out.token_ids) + _tokens(rng, loop.tool_output_len, loop.vocab)
    heapq.heappush(due, (now + loop.draw_latency(rng), i))
    return 0


# ---------------------------------------------------------------- CLI (`pacer sim` / `pacer bench --engine inprocess`)

AGENT_LOOP = "agent-loop"


def add_agent_loop_args(p: Any) -> None:
    """The `--workload agent-loop` flags (agents = --concurrency)."""
    g = p.add_argument_group("agent loop (--workload agent-loop; --concurrency agents, default 8)")
    g.add_argument("--agent-turns", type=int, default=6, help="agent loop: calls per job")
    g.add_argument("--tool-latency", type=float, default=1.0, help="agent loop: mean tool time between calls, s")
    g.add_argument("--tool-latency-dist", default="exponential", choices=TOOL_LATENCY_DISTRIBUTIONS,
                   help="agent loop: distribution of tool times around the mean")
    g.add_argument("--chat-rate", type=float, default=0.0,
                   help="agent loop: req/s of a chat tenant sharing the engine (default 0: none)")
    g.add_argument("--agent-system-len", type=int, default=64,
                   help="agent loop: tokens of the system prompt every agent shares")
    g.add_argument("--agent-task-len", type=int, default=48, help="agent loop: tokens of each agent's task")
    g.add_argument("--tool-output-len", type=int, default=None,
                   help="agent loop: tokens of each tool answer appended to the history (default 96); tool "
                        "reuse: tokens of each shared tool output (default 1024)")
    g.add_argument("--no-agent-sessions", action="store_true",
                   help="agent loop: send the calls without naming their session (no retention windows)")


def loop_from_args(args: Any) -> AgentLoop:
    """The agent loop the flags describe (--output-len sets the tokens per call)."""
    return AgentLoop(num_agents=args.concurrency or 8, turns=args.agent_turns, tool_latency=args.tool_latency,
                     tool_latency_dist=args.tool_latency_dist, chat_rate=args.chat_rate,
                     system_len=args.agent_system_len, task_len=args.agent_task_len,
                     tool_output_len=96 if args.tool_output_len is None else args.tool_output_len,
                     output_len=args.output_len or 8, seed=args.seed)


def result_lines(loop: AgentLoop, result: AgentLoopResult) -> list[str]:
    """The report of one agent-loop run: job completion time, follow-up TTFT, hits and retention counters."""
    row = result.row()
    stats = result.retention
    return [
        f"agent loop: {loop.num_agents} agents x {loop.turns} calls, tool {loop.tool_latency:g}s "
        f"({loop.tool_latency_dist}), final history {loop.max_history()} tokens, chat {loop.chat_rate:g}/s; "
        f"{result.wall:.1f} s",
        f"job completion time p50 {row['jct_p50']:.3f} s, mean {row['jct_mean']:.3f} s; follow-up TTFT p50 "
        f"{row['followup_ttft_p50'] * 1e3:.1f} ms; first-call TTFT p50 {result.pct(result.first_ttfts, 50) * 1e3:.1f} ms;"
        f" chat TTFT p99 {row['chat_ttft_p99'] * 1e3:.1f} ms",
        f"follow-up prompt tokens cached {row['followup_hit']:.0%}; retention hits {result.retention_hit_tokens} tokens;"
        f" windows opened {stats.get('windows_opened', 0)}, returns {stats.get('returns', 0)}, expiries "
        f"{stats.get('expiries', 0)}, releases {stats.get('releases', 0)}, capped {stats.get('capped', 0)}, "
        f"retained blocks demoted {stats.get('demoted_blocks', 0)}",
    ]
