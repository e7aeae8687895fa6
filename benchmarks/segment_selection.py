"""Which tokens of a reused segment to recompute (issue 28): the selection rules compared at equal
recompute fractions, on the workload of `benchmarks/segment_reuse.py` (N sessions with their own
histories receive the same tool outputs; session 0 computes each tool output and its KV is the
stored segment; the other sessions' requests reuse it at their own positions).

Rules, each recomputing m = ceil(r * n) of a segment's n tokens with the real context before them
(`pacer.model.selective_prefill`, a dense float32 forward on the default model's weights; every
other segment token keeps the stored KV re-rotated to its new position, at every layer):
- `first`: the segment's first m tokens (EPIC; the engine's rule, `segment_recompute`);
- `deviation`: the m tokens whose K and V at layer 1 deviate most from the stored ones, found by
  computing layer 0 and layer 1's K/V for the whole segment first (CacheBlend);
- `first+dev`: the first m/2 and the m/2 of the rest that deviate most;
- `random`: m tokens drawn at random (the control: does the choice matter?).
Quality against full prefill over the reference's 32 greedy tokens (teacher-forced): greedy
agreement, mean per-token KL(full || rule), change of the continuation's mean log-likelihood.
`segment compute` is the share of the segment's full prefill the rule spends in token-layers
(attention length aside): m/n for `first` and `random`, plus two layers over every other token
for the deviation rules.

    PYTHONPATH=src python benchmarks/segment_selection.py [--sessions 5] [--tools 300,700,1400]
        [--fractions 0,0.05,0.15,0.3] [--threads 2] [--quantization auto|none]

Deterministic on a given machine (the load average is printed for the wall time only).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from typing import Any

import torch

from pacer.llm import LLM
from pacer.model.segment_copy import rotate_keys, rotation
from pacer.model.selective_prefill import KV, deviation, selective_forward
from segment_reuse import build_prompts, cpu_flag_line, quality
from slo_common import loadavg

CONTINUATION = 32
RULES = ("first", "deviation", "first+dev", "random")


def full(model: Any, ids: list[int], start: int = 0, past: KV | None = None,
         logits_from: int | None = None) -> Any:
    t = torch.tensor(ids)
    pos = torch.arange(start, start + len(ids))
    return selective_forward(model, t, pos, past, None if past is None else torch.arange(start),
                             torch.ones(len(ids), dtype=torch.bool), logits_from=logits_from)


def greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """The reference continuation: n greedy tokens after full prefill."""
    res = full(model, ids, logits_from=len(ids) - 1)
    kv, out = res.kv, [int(res.logprobs[-1].argmax())]
    while len(out) < n:
        step = full(model, [out[-1]], len(ids) + len(out) - 1, kv, logits_from=0)
        kv = [(torch.cat([k, sk]), torch.cat([v, sv])) for (k, v), (sk, sv) in zip(kv, step.kv)]
        out.append(int(step.logprobs[-1].argmax()))
    return out


def choose(rule: str, m: int, dev: torch.Tensor, rng: random.Random) -> list[int]:
    n = len(dev)
    if rule == "first":
        return list(range(m))
    if rule == "random":
        return rng.sample(range(n), m)
    head = m // 2 if rule == "first+dev" else 0
    rest = dev.clone()
    rest[:head] = -1.0
    return list(range(head)) + rest.topk(m - head).indices.tolist()


class Reuse:
    """One request reusing a stored segment: its exact context, its span (segment, question and
    the reference continuation) and the stored KV re-rotated to the segment's positions."""

    def __init__(self, model: Any, ids: list[int], start: int, n: int, stored: tuple[int, KV]) -> None:
        s0, seg_kv = stored
        self.model, self.n, self.last = model, n, len(ids) - 1 - start
        self.cont = greedy(model, ids, CONTINUATION)
        self.prefix = full(model, ids[:start]).kv
        self.span = ids[start:] + self.cont[:-1]
        self.pos, self.past_pos = torch.arange(start, start + len(self.span)), torch.arange(start)
        cos, sin = rotation(torch.full((n,), start - s0), model.inv_freq)
        pad = torch.zeros(len(self.span) - n, *seg_kv[0][0].shape[1:])
        self.reuse = [(torch.cat([rotate_keys(k, cos, sin), pad]), torch.cat([v, pad])) for k, v in seg_kv]

    def run(self, chosen: list[int]) -> torch.Tensor:
        """Log-prob rows over the continuation with the segment's `chosen` tokens recomputed."""
        act = torch.zeros(len(self.span), dtype=torch.bool)
        act[chosen] = True
        act[self.n:] = True
        return selective_forward(self.model, torch.tensor(self.span), self.pos, self.prefix, self.past_pos, act,
                                 self.reuse, self.last).logprobs

    def deviation(self) -> torch.Tensor:
        """Per segment token, its layer-1 K/V with the real context against the stored one."""
        n = self.n
        probe = selective_forward(self.model, torch.tensor(self.span[:n]), self.pos[:n], self.prefix, self.past_pos,
                                  torch.ones(n, dtype=torch.bool), num_layers=2).kv[1]
        return deviation(probe, (self.reuse[1][0][:n], self.reuse[1][1][:n]))


def study(model: Any, prompts: list[tuple[list[int], list[Any]]], sessions: int, fractions: list[float],
          seed: int) -> tuple[dict[tuple[str, float], list[torch.Tensor]], list[torch.Tensor], list[list[int]],
                              dict[tuple[str, float], list[float]]]:
    """Per (rule, fraction): the reusing requests' log-prob rows and segment compute shares; with
    the full-prefill rows and the continuations they are scored on."""
    num_layers = model.arch.num_layers
    rows: dict[tuple[str, float], list[torch.Tensor]] = {}
    cost: dict[tuple[str, float], list[float]] = {}
    ref_rows: list[torch.Tensor] = []
    conts: list[list[int]] = []
    rng = random.Random(seed)
    stored: tuple[int, KV] = (0, [])
    for k, (ids, spans) in enumerate(prompts):
        (s, n), = spans
        if k % sessions == 0:   # session 0 meets this tool output first: its KV is the stored segment
            stored = (s, [(kk[s:s + n], vv[s:s + n]) for kk, vv in full(model, ids).kv])
            continue
        req = Reuse(model, ids, s, n, stored)
        ref_rows.append(req.run(list(range(n))))
        conts.append(req.cont)
        dev = req.deviation()
        for r in fractions:
            m = math.ceil(r * n)
            for rule in RULES if r else ("none",):
                rows.setdefault((rule, r), []).append(req.run(choose(rule, m, dev, rng) if m else []))
                extra = (n - m) * 2 / num_layers if rule in ("deviation", "first+dev") else 0.0
                cost.setdefault((rule, r), []).append((m + extra) / n)
    return rows, ref_rows, conts, cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--tools", default="300,700,1400", help="tool output lengths in tokens")
    ap.add_argument("--fractions", default="0,0.05,0.15,0.3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quantization", default="auto", help="auto: the GGUF's packed blocks, as served; none: float32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"cpu flags: {cpu_flag_line()}; torch threads {args.threads}; load average {loadavg()} (start)")
    t0 = time.perf_counter()
    llm = LLM(num_kv_blocks=64, quantization=args.quantization)
    model = llm.engine.executor.model
    prompts = build_prompts(llm, args.sessions, [int(x) for x in args.tools.split(",")], args.seed)
    rows, ref_rows, conts, cost = study(model, prompts, args.sessions,
                                        [float(x) for x in args.fractions.split(",")], args.seed)
    lens = [len(ids) for ids, _ in prompts]
    print(f"{len(ref_rows)} reusing requests ({args.sessions} sessions x tool outputs of {args.tools} tokens, "
          f"prompts {min(lens)}-{max(lens)}); {model.arch.num_layers} layers; reference continuation "
          f"{CONTINUATION} greedy tokens; {model.weights_line()}")
    print(f"{'rule':10s} {'r':>5s} {'segment compute':>16s} {'agree':>6s} {'KL':>8s} {'dLL':>8s}")
    for (rule, r), got in rows.items():
        q = quality(ref_rows, got, conts, [True] * len(got))
        c = sum(cost[(rule, r)]) / len(cost[(rule, r)])
        print(f"{rule:10s} {r:5.2f} {c:16.3f} {q['agree']:6.3f} {q['kl']:8.4f} {q['dll']:+8.4f}", flush=True)
    print(f"load average {loadavg()} (end); {time.perf_counter() - t0:.0f} s")
    llm.close()


if __name__ == "__main__":
    main()
