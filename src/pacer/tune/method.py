"""The seeds' batch-limit method, step by step, on the simulator (`pacer tune`):

1. the SLA (`--slo`), fixed first;
2. the traffic's prompt / output length CV (a high CV spikes TPOT p99 at a lower batch);
3. the largest `max_num_seqs` before KV pressure: the knee, where preemptions start or TPOT p99
   turns up (rises more than `turn` x from one sweep point to the next);
4. then `max_num_batched_tokens` at that `max_num_seqs` (the seed's starting point:
   max_num_seqs x the mean prompt);
5. chunked prefill on or off, by whether its TTFT gain is worth its TPOT cost against the SLA
   (the higher attainment wins; a tie keeps it on, which protects TPOT).

Each step prints its evidence. The chosen configuration and the runner-up come out for `--verify`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pacer.diagnose.replay import Replay, SimTarget, fmt_ms
from pacer.workload.report import SloSet
from pacer.workload.spec import RequestSpec

__all__ = ["Point", "find_knee", "MethodResult", "run_method", "rank_key", "length_cv", "DEFAULT_SEQS",
           "DEFAULT_BUDGETS"]

DEFAULT_SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_BUDGETS = (256, 512, 1024, 2048, 4096, 8192)
TURN = 1.5
PREEMPTION_TOLERANCE = 0.05   # preemptions per request still counted as none (one stray preemption)


@dataclass(frozen=True, slots=True)
class Point:
    """One simulated configuration."""

    kwargs: dict[str, Any]
    summary: dict[str, Any]

    def get(self, key: str, default: float = math.nan) -> float:
        v = self.summary.get(key)
        return default if v is None else float(v)

    @property
    def label(self) -> str:
        k = self.kwargs
        chunk = "" if k.get("enable_chunked_prefill", True) else " --no-enable-chunked-prefill"
        return (f"--max-num-seqs {k.get('max_num_seqs', 256)} --max-num-batched-tokens "
                f"{k.get('max_num_batched_tokens', 'default')}{chunk}")

    @property
    def attainment(self) -> float:
        return self.get("slo_attainment", 0.0)


def find_knee(seqs: Sequence[int], preempted_share: Sequence[float], tpot_p99: Sequence[float],
              turn: float = TURN, tolerance: float = PREEMPTION_TOLERANCE) -> int:
    """Index of the largest max_num_seqs before KV pressure: the point before the first one where
    preemptions start (more than `tolerance` preemptions per request) or TPOT p99 turns up (its
    growth from the previous point exceeds `turn` x the growth before that: a bend, not the steady
    rise of a bigger batch). 0 when even the first point preempts; the last when no pressure shows."""
    for i in range(len(seqs)):
        turned = False
        if i >= 2 and min(tpot_p99[i - 2], tpot_p99[i - 1]) > 0:
            growth, before = tpot_p99[i] / tpot_p99[i - 1], tpot_p99[i - 1] / tpot_p99[i - 2]
            turned = growth > turn * max(1.0, before)
        if preempted_share[i] > tolerance or turned:
            return max(0, i - 1)
    return len(seqs) - 1


def rank_key(p: Point, target: float) -> tuple[Any, ...]:
    """Meets the attainment target, then attainment, goodput, and a lower TTFT p99."""
    return (p.attainment >= target, round(p.attainment, 3), round(p.get("goodput_req_s", 0.0), 3),
            -p.get("ttft_p99", math.inf))


def length_cv(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    m = statistics.fmean(values)
    return m, (statistics.pstdev(values) / m if m > 0 and len(values) > 1 else 0.0)


@dataclass(slots=True)
class MethodResult:
    chosen: Point
    runner_up: Point | None
    defaults: Point
    knee_seqs: int
    log: list[str] = field(default_factory=list)


class _Sweeper:
    def __init__(self, target: SimTarget, specs: Sequence[RequestSpec], slo: SloSet, say: Callable[[str], None]):
        self.target, self.specs, self.slo, self.say = target, specs, slo, say
        self.seen: dict[str, Point] = {}

    def point(self, kwargs: dict[str, Any]) -> Point:
        p = Point(dict(kwargs), {})
        if p.label not in self.seen:
            rep: Replay = self.target.run(p.label, kwargs, self.specs, self.slo)
            self.seen[p.label] = Point(dict(kwargs), rep.summary)
        return self.seen[p.label]

    def row(self, p: Point, mark: str = "") -> None:
        self.say(f"    {p.kwargs.get('max_num_seqs', 256):>5} {p.kwargs.get('max_num_batched_tokens', '-'):>6} "
                 f"{'on' if p.kwargs.get('enable_chunked_prefill', True) else 'off':>4} "
                 f"{int(p.get('preemptions', 0)):>6} {fmt_ms(p.summary.get('ttft_p50')):>9} "
                 f"{fmt_ms(p.summary.get('ttft_p99')):>9} {fmt_ms(p.summary.get('tpot_p99')):>9} "
                 f"{p.get('output_tok_s', 0):>7.1f} {p.attainment:>6.0%}  {mark}")

    def header(self) -> None:
        self.say("    seqs  budget  chunk preempt  TTFT p50  TTFT p99  TPOT p99  out t/s   SLO")


def run_method(target: SimTarget, base_kwargs: dict[str, Any], specs: Sequence[RequestSpec], slo: SloSet,
               target_attainment: float, seqs_list: Sequence[int] = DEFAULT_SEQS,
               budgets: Sequence[int] = DEFAULT_BUDGETS, say: Callable[[str], None] = print) -> MethodResult:
    """Steps 3-5 on the simulator (steps 1-2 are printed by the caller before anything runs)."""
    sw = _Sweeper(target, specs, slo, say)
    base = {k: v for k, v in base_kwargs.items() if k not in ("max_num_seqs", "max_num_batched_tokens",
                                                               "enable_chunked_prefill")}
    defaults = sw.point(base)
    budget0 = int(base_kwargs.get("max_num_batched_tokens") or 2048)
    chunk0 = bool(base_kwargs.get("enable_chunked_prefill", True))
    say(f"(3) the largest max_num_seqs before KV pressure (budget {budget0}, chunked prefill "
        f"{'on' if chunk0 else 'off'}; knee: > {PREEMPTION_TOLERANCE:g} preemptions per request, or TPOT p99 "
        f"bending up: growth > {TURN:g}x the previous growth)")
    sw.header()
    pts = [sw.point({**base, "max_num_seqs": s, "max_num_batched_tokens": max(budget0, s),
                     "enable_chunked_prefill": chunk0}) for s in seqs_list]
    n = max(1, len(specs))
    k = find_knee([p.kwargs["max_num_seqs"] for p in pts], [p.get("preemptions", 0) / n for p in pts],
                  [p.get("tpot_p99", 0) for p in pts])
    for i, p in enumerate(pts):
        sw.row(p, "<- knee" if i == k else "")
    knee = int(pts[k].kwargs["max_num_seqs"])
    why = "preemptions start" if k + 1 < len(pts) and pts[k + 1].get("preemptions", 0) / n > PREEMPTION_TOLERANCE else (
        "TPOT p99 turns up" if k + 1 < len(pts) else "no KV pressure in the sweep")
    say(f"    knee: max_num_seqs {knee} ({why} above it)")
    mean_prompt = statistics.fmean(s.prompt_tokens for s in specs) if specs else 0.0
    say(f"(4) max_num_batched_tokens at max_num_seqs {knee} (seed's start: max_num_seqs x mean prompt = "
        f"{knee * mean_prompt:.0f})")
    sw.header()
    bpts = [sw.point({**base, "max_num_seqs": knee, "max_num_batched_tokens": b, "enable_chunked_prefill": True})
            for b in budgets if b >= knee]
    best_b = max(bpts, key=lambda p: rank_key(p, target_attainment))
    for p in bpts:
        sw.row(p, "<- best" if p is best_b else "")
    on = best_b
    off_budget = max(int(on.kwargs["max_num_batched_tokens"]), target.max_model_len(base))
    off = sw.point({**base, "max_num_seqs": knee, "max_num_batched_tokens": off_budget,
                    "enable_chunked_prefill": False})
    say("(5) chunked prefill: on (above) vs off (whole prompts, budget >= max_model_len)")
    sw.header()
    sw.row(on, "on")
    sw.row(off, "off")
    gain = 1 - off.get("ttft_p99") / on.get("ttft_p99") if on.get("ttft_p99") else 0.0
    cost = off.get("tpot_p99") / on.get("tpot_p99") - 1 if on.get("tpot_p99") else 0.0
    def sla(p: Point) -> tuple[bool, float]:   # the SLA decides; a tie keeps chunked prefill on
        return p.attainment >= target_attainment, round(p.attainment, 3)

    chosen = off if sla(off) > sla(on) else on
    say(f"    off vs on: TTFT p99 {gain * 100:+.0f}% gain, TPOT p99 {cost * 100:+.0f}% cost; SLO met "
        f"{off.attainment:.0%} vs {on.attainment:.0%} -> chunked prefill {'off' if chosen is off else 'on'}")
    others = sorted((p for p in sw.seen.values() if p.label != chosen.label and p.label != defaults.label),
                    key=lambda p: rank_key(p, target_attainment), reverse=True)
    return MethodResult(chosen, others[0] if others else None, defaults, knee)
