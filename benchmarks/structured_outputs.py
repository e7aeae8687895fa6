"""Evidence that constrained decoding does not stall or slow the engine.

On an in-process engine with the default model (default 2 torch threads), prints:
- output tok/s of N concurrent JSON-schema requests vs the same N prompts unconstrained at
  equal output lengths (each unconstrained request gets `max_tokens` = its constrained
  twin's length, `ignore_eos`; the constrained batch keeps its seeds, so every run repeats
  those lengths), in repeats of alternating order (json then plain, plain then json, ...),
  each repeat's ratio with the load average, then their median (target >= 0.9x);
- the mask time the steps waited for after their forward, as a share of those steps' time
  (target <= 5%), beside the time the mask thread spent computing masks in all;
- compile time of a cold schema (worker round trip included) vs a cached one;
- the rate of valid outputs (jsonschema) on bounded schemas (maxLength, enum, maxItems).

    .venv/bin/python benchmarks/structured_outputs.py [--num-requests 16] [--repeats 6]

Times are noisy on a shared machine (the load average is printed beside them); nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import jsonschema

from pacer.engine import Engine
from pacer.request import SamplingParams, StructuredOutputsParams

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "additionalProperties": False, "required": ["name", "age", "color"],
     "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0,
                                                                         "maximum": 99},
                    "color": {"enum": ["red", "green", "blue"]}}},
    {"type": "object", "additionalProperties": False, "required": ["city", "tags"],
     "properties": {"city": {"type": "string", "maxLength": 12},
                    "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["sunny", "rainy", "windy"]}}}},
]
PROMPTS = ["Describe a person as JSON.", "Give me the weather report as JSON.", "A JSON record, please:",
           "Fill in this form:"]


def load() -> str:
    return "load avg {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def run_batch(engine: Engine, prompts: list[str], params: list[SamplingParams]) -> tuple[list[Any], float, float]:
    """The outputs, wall seconds and this process's CPU seconds (all its threads) of one batch."""
    t0, c0 = time.perf_counter(), time.process_time()
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    finals = {o.request_id: o for o in engine.run_until_done()}
    return [finals[i] for i in ids], time.perf_counter() - t0, time.process_time() - c0


def constrained_params(n: int, seed0: int) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=200, temperature=1.0, seed=seed0 + i,
                           structured_outputs=StructuredOutputsParams(json=SCHEMAS[i % len(SCHEMAS)]))
            for i in range(n)]


def compile_times(manager: Any) -> tuple[list[float], list[float]]:
    """Cold (worker round trip) and cached compile times of 3 fresh schemas."""
    for schema in SCHEMAS:   # warm the workers; also the first (cold) compiles of the run's schemas
        manager.request(StructuredOutputsParams(json=schema)).result(120)
    cold, cached = [], []
    for k in range(3):
        fresh = StructuredOutputsParams(json={**SCHEMAS[0], "title": f"cold-{time.time_ns()}-{k}"})
        t0 = time.perf_counter()
        manager.request(fresh).result(120)
        cold.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        manager.request(fresh).result(120)
        cached.append(time.perf_counter() - t0)
    return cold, cached


class Constrained:
    """Runs of the JSON-schema batch: their rates, valid outputs and mask times."""

    def __init__(self, engine: Engine, prompts: list[str], params: list[SamplingParams]) -> None:
        self.engine, self.prompts, self.params = engine, prompts, params
        self.steps: list[Any] = []
        engine.stats_listeners.append(self.steps.append)
        self.valid = self.total = 0
        self.waited = self.computed = self.step_s = 0.0

    def run(self) -> tuple[float, float, list[int]]:
        """One run: (output tok/s, tokens per CPU second, each request's output length)."""
        before = self.engine.snapshot().structured
        self.steps.clear()
        outs, secs, cpu = run_batch(self.engine, self.prompts, self.params)
        after = self.engine.snapshot().structured
        self.step_s += sum(s.total_s for s in self.steps)
        self.waited += after["mask_wait_seconds"] - before["mask_wait_seconds"]
        self.computed += after["mask_compute_seconds"] - before["mask_compute_seconds"]
        for o, sp in zip(outs, self.params):
            self.total += 1
            try:
                assert sp.structured_outputs is not None and isinstance(sp.structured_outputs.json, dict)
                jsonschema.validate(json.loads(o.text), sp.structured_outputs.json)
                self.valid += o.finish_reason == "stop"
            except (ValueError, jsonschema.ValidationError):
                pass
        lengths = [len(o.token_ids) for o in outs]
        return sum(lengths) / secs, sum(lengths) / cpu, lengths


def run_plain(engine: Engine, prompts: list[str], lengths: list[int]) -> tuple[float, float]:
    """The same prompts unconstrained, each forced to its constrained twin's output length:
    (output tok/s, tokens per CPU second)."""
    plain = [SamplingParams(max_tokens=k, temperature=1.0, seed=i, ignore_eos=True) for i, k in enumerate(lengths)]
    outs, secs, cpu = run_batch(engine, prompts, plain)
    tokens = sum(len(o.token_ids) for o in outs)
    return tokens / secs, tokens / cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=6, help="json/plain pairs, in alternating order")
    ap.add_argument("--num-threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine.from_kwargs(num_threads=args.num_threads, kv_cache_memory="512MiB")
    n = args.num_requests
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    manager = engine.structured_outputs
    cold, cached = compile_times(manager)
    run_batch(engine, prompts[:4], constrained_params(4, 999))   # warm-up: allocations, first masks
    batch = Constrained(engine, prompts, constrained_params(n, 100))   # the same seeds every run
    _, _, lengths = batch.run()   # its lengths are the unconstrained twins' (seeded: each run repeats them)
    ratios = []
    full: dict[str, list[float]] = {"json": [], "plain": []}   # decode steps with all n requests running
    mode = ["json"]
    engine.stats_listeners.append(lambda s: full[mode[0]].append(s.total_s) if s.kind == "decode"
                                  and s.batch_size == n else None)
    for r in range(args.repeats):   # A/B, B/A, ...: drifts in the machine's load hit both sides alike
        for side in (("json", "plain") if r % 2 == 0 else ("plain", "json")):
            mode[0] = side   # the stats listener files this side's decode steps
            if side == "json":
                js, js_cpu, got = batch.run()
            else:
                pl, pl_cpu = run_plain(engine, prompts, lengths)
        ratios.append(js / pl)
        print(f"repeat {r} ({'json, plain' if r % 2 == 0 else 'plain, json'}): json {js:.1f} tok/s, "
              f"plain {pl:.1f} tok/s, ratio {js / pl:.2f}x (per CPU second {js_cpu / pl_cpu:.2f}x) "
              f"({sum(got)} vs {sum(lengths)} tokens)  [{load()}]")
    print(f"output tok/s, {n} concurrent json_schema vs unconstrained at equal lengths: median ratio "
          f"{statistics.median(ratios):.2f}x, mean {statistics.fmean(ratios):.2f}x over {len(ratios)} repeats "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}; target >= 0.9x)  [{load()}]")
    sj, sp = statistics.median(full["json"]), statistics.median(full["plain"])
    print(f"median decode step with all {n} running (a median drops the steps other load stalled): json "
          f"{sj * 1e3:.1f} ms vs plain {sp * 1e3:.1f} ms = {sp / sj:.2f}x the speed ({len(full['json'])} vs "
          f"{len(full['plain'])} steps)")
    waited, step_s = batch.waited, batch.step_s
    print(f"mask wait after the forward: {waited * 1e3:.1f} ms = {100 * waited / step_s:.2f}% of the constrained "
          f"steps' {step_s:.2f} s (target <= 5%); mask thread compute in all {batch.computed * 1e3:.1f} ms "
          f"({100 * batch.computed / step_s:.1f}% of step time, overlapped)")
    print(f"compile: cold schema {1e3 * sorted(cold)[1]:.1f} ms (median of 3, worker round trip) vs cached "
          f"{1e6 * sorted(cached)[1]:.1f} us")
    print(f"valid outputs: {batch.valid}/{batch.total} = {100 * batch.valid / batch.total:.0f}% (jsonschema, "
          f"bounded schemas, max_tokens=200)")
    manager.close()


if __name__ == "__main__":
    main()
