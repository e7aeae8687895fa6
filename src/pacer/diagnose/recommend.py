"""The next experiment, in the seed's terms, with concrete flag values.

queue -> replicas / admission / routing; prefill -> prompt length, prefix caching, chunk size,
`long_prefill_token_threshold`; decode -> token budget, decode priority, speculative decoding;
preemption -> KV memory, `max_num_seqs`, `max_num_batched_tokens`. A recommendation that is an
engine setting carries it (`engine`) so `--what-if` can simulate it; replicas are simulated as
one replica's round-robin share of the trace; the rest are advice without a simulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pacer.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
from pacer.diagnose.analysis import ClassReport
from pacer.diagnose.records import Record

__all__ = ["Recommendation", "Settings", "recommend", "peak_running"]


@dataclass(frozen=True, slots=True)
class Recommendation:
    part: str                       # the bottleneck it addresses
    action: str                     # replicas | admission | routing | chunk | threshold | ...
    text: str
    flags: str = ""                 # the CLI flags (pacer serve; vLLM's names)
    engine: dict[str, Any] = field(default_factory=dict)   # engine-kwarg changes, for --what-if
    replicas: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"part": self.part, "action": self.action, "text": self.text, "flags": self.flags,
                "engine": self.engine, **({"replicas": self.replicas} if self.replicas > 1 else {})}

    @property
    def simulable(self) -> bool:
        return bool(self.engine) or self.replicas > 1


@dataclass(frozen=True, slots=True)
class Settings:
    """Today's settings, as far as the recommendations need them."""

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    long_prefill_token_threshold: int | None
    preemption_mode: str
    kv_tokens: int
    kv_cache_memory: int | None     # bytes, where the KV budget is given as memory (CPU)
    is_cpu: bool

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any], kv_tokens: int, max_model_len: int, is_cpu: bool) -> Settings:
        from pacer.config import EngineConfig

        cfg = EngineConfig.from_kwargs(**kwargs)
        s, c = cfg.scheduler, cfg.cache
        budget = s.max_num_batched_tokens or (DEFAULT_MAX_NUM_BATCHED_TOKENS if s.enable_chunked_prefill
                                              else max_model_len)
        mem = c.kv_cache_memory
        mem_bytes = _parse_bytes(mem) if mem is not None else None
        return cls(s.max_num_seqs, budget, s.enable_chunked_prefill, c.enable_prefix_caching,
                   s.long_prefill_token_threshold, s.preemption_mode, kv_tokens, mem_bytes, is_cpu)


def _parse_bytes(value: int | str) -> int:
    if isinstance(value, int):
        return value
    text = value.strip()
    units = {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "B": 1}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(float(text))


def _mib(n: int) -> str:
    return f"{max(1, round(n / 2 ** 20))}MiB"


def peak_running(records: Sequence[Record]) -> int:
    """Most requests between first scheduled and finish at once (from the source's times)."""
    events: list[tuple[float, int]] = []
    for r in records:
        start = r.scheduled_at if r.scheduled_at is not None else (None if r.arrival is None else r.first_token_at)
        if start is None or r.finished_at is None:
            continue
        events += [(start, 1), (r.finished_at, -1)]
    peak = cur = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):
        cur += d
        peak = max(peak, cur)
    return peak


def _queue(rep: ClassReport, today: Settings, peak: int, ttft_target: float | None) -> list[Recommendation]:
    out = []
    lam, mu = rep.extra.get("arrival_req_s"), rep.extra.get("completion_req_s")
    if lam and mu and lam > 0.9 * mu:
        k = max(2, math.ceil(lam / mu * 1.2))
        out.append(Recommendation("queue", "replicas", f"add replicas: {k} (arrivals {lam:.2f} req/s against "
                                  f"{mu:.2f} req/s completed by this one)", f"{k} x pacer serve behind a router",
                                  replicas=k))
    if rep.num_preemptions or peak < 0.9 * today.max_num_seqs:
        out.extend(r for r in _preemption(rep, today, rep.lengths["prompt_mean"] + rep.lengths["output_mean"])
                   if r.action == "kv_memory")
        out[-1:] = [Recommendation("queue", "kv_memory", f"admissions are held by KV, not max_num_seqs: at most "
                                   f"{peak} ran at once (limit {today.max_num_seqs}); {out[-1].text}",
                                   out[-1].flags, out[-1].engine)] if out else []
    if peak >= 0.9 * today.max_num_seqs and rep.num_preemptions == 0:
        n = today.max_num_seqs * 2
        out.append(Recommendation("queue", "max_num_seqs", f"admit more at once: {peak} ran together, the "
                                  f"limit is {today.max_num_seqs} and KV never ran out",
                                  f"--max-num-seqs {n}", {"max_num_seqs": n}))
    drain = mu or 1.0
    cap = max(4, math.ceil(drain * (ttft_target or 2.0)))
    out.append(Recommendation("queue", "admission", f"admission control: refuse (429) past the queue one replica "
                              f"drains within {'the TTFT target' if ttft_target else '2 s'}",
                              f"--max-waiting {cap}"))
    out.append(Recommendation("queue", "routing", "routing: give this class its own replica pool (or route by "
                              "prefix-cache affinity) so other traffic does not queue in front of it"))
    return out


def _prefill(rep: ClassReport, today: Settings) -> list[Recommendation]:
    out = []
    if not today.enable_chunked_prefill:
        out.append(Recommendation("prefill", "chunked_prefill", "chunk prompts and mix them with decodes",
                                  "--enable-chunked-prefill --max-num-batched-tokens 2048",
                                  {"enable_chunked_prefill": True, "max_num_batched_tokens": 2048}))
    budget = today.max_num_batched_tokens
    t = max(64, (today.long_prefill_token_threshold or budget) // 4)
    out.append(Recommendation("prefill", "long_prefill_token_threshold",
                              f"cap a long prompt's share of a step at {t} tokens so short requests are admitted "
                              "beside it", f"--long-prefill-token-threshold {t}",
                              {"long_prefill_token_threshold": t}))
    if today.enable_chunked_prefill and budget > 512:
        b = max(512, budget // 2)
        out.append(Recommendation("prefill", "chunk_size", f"smaller prefill chunks: {b} tokens per step "
                                  "(decodes stall less; the long prompt takes more steps)",
                                  f"--max-num-batched-tokens {b}", {"max_num_batched_tokens": b}))
    if not today.enable_prefix_caching:
        out.append(Recommendation("prefill", "prefix_caching", "reuse shared prompt prefixes",
                                  "--enable-prefix-caching", {"enable_prefix_caching": True}))
    p90 = int(rep.lengths.get("prompt_p90", 0))
    out.append(Recommendation("prefill", "prompt_length", f"shorter prompts: p90 is {p90} tokens "
                              f"(cached {rep.lengths.get('cached_share', 0.0):.0%}); fewer retrieved chunks, tool "
                              "definitions loaded lazily, a stable shared prefix first"))
    return out


def _decode(rep: ClassReport, today: Settings, peak: int) -> list[Recommendation]:
    out = []
    budget = today.max_num_batched_tokens
    if budget > 512:
        b = max(512, budget // 4)
        out.append(Recommendation("decode", "token_budget", f"a smaller token budget: {b} (less prefill rides "
                                  "in each decode step, so inter-token gaps shrink)",
                                  f"--max-num-batched-tokens {b}", {"max_num_batched_tokens": b}))
    if peak > 8:
        n = max(4, peak // 2)
        out.append(Recommendation("decode", "max_num_seqs", f"a smaller decode batch: {n} (ran {peak} at once)",
                                  f"--max-num-seqs {n}", {"max_num_seqs": n}))
    out.append(Recommendation("decode", "decode_priority", "decode priority for interactive traffic: send it "
                              "with priority 0 and batch jobs with 1", "--scheduling-policy priority"))
    out.append(Recommendation("decode", "speculative_decoding", "speculative decoding for long outputs",
                              "(vLLM) --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'"))
    return out


def _preemption(rep: ClassReport, today: Settings, per_request_tokens: float) -> list[Recommendation]:
    out = []
    if today.is_cpu:
        mem = (today.kv_cache_memory or 0) * 2
        if mem:
            out.append(Recommendation("preemption", "kv_memory", f"twice the KV memory ({today.kv_tokens} tokens "
                                      "now)", f"--kv-cache-memory {_mib(mem)}", {"kv_cache_memory": mem}))
        else:
            blocks = max(1, today.kv_tokens // 16) * 2
            out.append(Recommendation("preemption", "kv_memory", f"twice the KV blocks ({today.kv_tokens} tokens "
                                      "now)", f"--num-kv-blocks {blocks}", {"num_kv_blocks": blocks}))
    else:
        out.append(Recommendation("preemption", "kv_memory", "more KV memory",
                                  "--gpu-memory-utilization 0.95 (or --kv-cache-dtype fp8)",
                                  {"gpu_memory_utilization": 0.95}))
    fit = max(1, int(today.kv_tokens // max(1.0, per_request_tokens)))
    if fit < today.max_num_seqs:
        out.append(Recommendation("preemption", "max_num_seqs", f"run at most {fit} at once: that many requests "
                                  f"of {per_request_tokens:.0f} tokens (prompt + output) fit in {today.kv_tokens} KV "
                                  "tokens", f"--max-num-seqs {fit}", {"max_num_seqs": fit}))
    if today.max_num_batched_tokens > 512:
        b = max(512, today.max_num_batched_tokens // 2)
        out.append(Recommendation("preemption", "max_num_batched_tokens", f"admit prompts in {b}-token steps so "
                                  "fewer new sequences grab KV at once", f"--max-num-batched-tokens {b}",
                                  {"max_num_batched_tokens": b}))
    if today.preemption_mode == "recompute":
        out.append(Recommendation("preemption", "swap", "swap preempted KV to host memory instead of recomputing",
                                  "--preemption-mode swap --swap-space 4", {"preemption_mode": "swap"}))
    return out


def recommend(rep: ClassReport, records: Sequence[Record], today: Settings,
              ttft_target: float | None = None) -> list[Recommendation]:
    """The next experiments for a class's bottleneck (none: nothing to change)."""
    peak = peak_running(records)
    if rep.bottleneck == "queue":
        return _queue(rep, today, peak, ttft_target)
    if rep.bottleneck == "prefill":
        return _prefill(rep, today)
    if rep.bottleneck == "decode":
        return _decode(rep, today, peak)
    if rep.bottleneck == "preemption":
        return _preemption(rep, today, rep.lengths["prompt_mean"] + rep.lengths["output_mean"])
    return []
