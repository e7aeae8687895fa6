"""The prefix-cache timing channel, measured from the attacker's side of an OpenAI endpoint.

One trial: the victim (key A) sends a fresh prompt P, so the server caches it; then the
attacker (key B, another tenant) sends P and a fresh prompt Q of the same length that nobody
has sent, in random order, each with `max_tokens=1`, and times both end to end. If B's P is
faster than its Q, B learns that someone sent P. The paired log ratio `log(t_P / t_Q)` per
trial feeds an equivalence test (`pacer.workload.equivalence.tost_paired`): under tenant
isolation it must be equivalent to 0 within the margin; under a shared cache it is not.
Prompts are random token ids, fresh per trial (never a prefix of one another).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import httpx

__all__ = ["Trial", "run_trials", "log_ratios"]


@dataclass(frozen=True, slots=True)
class Trial:
    t_cached: float          # attacker's latency on the prompt the victim sent, s
    t_fresh: float           # attacker's latency on a prompt nobody sent, s
    cached_tokens: int       # what the server reported as cached for the attacker's P
    victim_first: bool       # order of the attacker's two probes in this trial (random)


def run_trials(base_url: str, model: str, victim_key: str, attacker_key: str, num_trials: int,
               prompt_len: int = 256, seed: int = 0, vocab: tuple[int, int] = (1000, 48000),
               timeout: float = 120.0) -> list[Trial]:
    rng = random.Random(seed)
    trials = []
    with httpx.Client(base_url=base_url, timeout=timeout) as client:
        def send(key: str, prompt: list[int]) -> tuple[float, int]:
            body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            start = time.perf_counter()
            r = client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            elapsed = time.perf_counter() - start
            r.raise_for_status()
            details = r.json()["usage"].get("prompt_tokens_details") or {}
            return elapsed, int(details.get("cached_tokens") or 0)

        send(attacker_key, [rng.randrange(*vocab) for _ in range(prompt_len)])   # warm-up, not counted
        for _ in range(num_trials):
            victim = [rng.randrange(*vocab) for _ in range(prompt_len)]
            fresh = [rng.randrange(*vocab) for _ in range(prompt_len)]
            send(victim_key, victim)
            victim_first = rng.random() < 0.5
            if victim_first:
                (t_cached, cached), (t_fresh, _) = send(attacker_key, victim), send(attacker_key, fresh)
            else:
                (t_fresh, _), (t_cached, cached) = send(attacker_key, fresh), send(attacker_key, victim)
            trials.append(Trial(t_cached, t_fresh, cached, victim_first))
    return trials


def log_ratios(trials: list[Trial]) -> list[float]:
    return [math.log(t.t_cached / t.t_fresh) for t in trials]
