"""Does a pathological-but-valid JSON schema stall co-batched requests? (issue 27, finding 5)

Runs the real default model twice, side by side in one process: N plain requests decoding
alone, then the same N with a constrained request whose schema is expensive for llguidance
(an object of 6,000 required integer properties: ~0.8 s to compile and compute its first
mask on this machine) added while they decode. Each run has a fresh grammar manager (no
cache). Prints the plain requests' inter-token latency p50/p99 in both runs and the ratio
(target <= 2x: the compile and first mask run in the worker and the pool thread, never in a
step, both at a lower CPU priority), with the load average and the CPU flags beside them.
Each run's worker is started before the timed decode, as a serving engine's would be.

    PYTHONPATH=src python benchmarks/grammar_stall.py [--plain 4] [--tokens 48] [--props 6000]
"""

from __future__ import annotations

import argparse
import os
import time

from pacer.engine import Engine
from pacer.request import SamplingParams, StructuredOutputsParams
from pacer.structured.manager import StructuredOutputManager

PROMPTS = ["Tell me about the sea.", "Describe a mountain.", "Why is the sky blue?", "What do cats eat?",
           "How do trains work?", "Name three rivers.", "What is rain?", "Explain a rainbow."]


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        flags = ""
    return ",".join(x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {x}" in flags) or "none"


def pathological(props: int) -> dict[str, object]:
    names = [f"field_{i}" for i in range(props)]
    return {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": names}


def run(engine: Engine, plain: int, tokens: int, schema: dict[str, object] | None) -> tuple[list[float], float]:
    """(the plain requests' inter-token gaps in seconds, the constrained request's wait or 0)."""
    manager = StructuredOutputManager(engine.tokenizer, engine.vocab_size, engine.eos_token_ids, timeout=30,
                                      num_workers=1)
    engine.install_structured_outputs(manager)
    manager.request(StructuredOutputsParams(regex="a")).result(120)   # its worker is up (a server's would be)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    ids = {engine.add_request(PROMPTS[i % len(PROMPTS)], params) for i in range(plain)}
    last: dict[str, float] = {}
    gaps: list[float] = []
    added = constrained = None
    t_added = waited = 0.0
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for o in outs:
            if o.request_id in ids:
                if o.request_id in last:
                    gaps.append(now - last[o.request_id])
                last[o.request_id] = now
            elif o.request_id == constrained and o.finished:
                waited = now - t_added
        if schema is not None and added is None and len(last) == plain:   # all plain requests decode
            constrained = engine.add_request("Fill the form.", SamplingParams(
                max_tokens=8, structured_outputs=StructuredOutputsParams(json=schema)))
            added, t_added = True, time.perf_counter()
    engine.install_structured_outputs(None)
    return gaps, waited


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plain", type=int, default=4, help="co-batched plain requests")
    ap.add_argument("--tokens", type=int, default=48, help="tokens each plain request decodes")
    ap.add_argument("--props", type=int, default=6000, help="required properties of the pathological schema")
    args = ap.parse_args()
    engine = Engine.from_kwargs(num_kv_blocks=256, num_threads=1)
    run(engine, args.plain, 4, None)   # warm-up (torch, the worker's imports)
    base, _ = run(engine, args.plain, args.tokens, None)
    with_bad, waited = run(engine, args.plain, args.tokens, pathological(args.props))
    load = "load avg {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    print(f"cpu flags: {cpu_flags()}  cores: {os.cpu_count()}  {load}")
    print(f"plain alone:          ITL p50 {pct(base, .5) * 1e3:.1f} ms  p99 {pct(base, .99) * 1e3:.1f} ms  "
          f"({len(base)} gaps)")
    print(f"beside {args.props}-property schema: ITL p50 {pct(with_bad, .5) * 1e3:.1f} ms  "
          f"p99 {pct(with_bad, .99) * 1e3:.1f} ms  ({len(with_bad)} gaps; the constrained request "
          f"finished {waited:.2f} s after it arrived)")
    print(f"ITL p99 ratio: {pct(with_bad, .99) / pct(base, .99):.2f}x (target <= 2x)  {load}")


if __name__ == "__main__":
    main()
