"""Quality of quantized KV (kv_cache_dtype) on the default model, measured, not assumed.

    PYTHONPATH=src .venv/bin/python benchmarks/kv_quality.py [--full]

Text: the prose of the project's README.md (shipped, read by no test), fenced code, tables
and the section reporting these results removed; the README moves, so the figures in it
name the commit they were measured at. Perplexity: its first 4,096 tokens (--full: all) in windows of 1,024, each prefilled
in 256-token chunks so later chunks read the earlier context back from the quantized cache, as
serving does. Greedy agreement: 32 prompts (--full: 64) of 48 tokens taken at even spacing
through the text, 32 greedy tokens with each KV dtype; the fraction of prompts whose 32 tokens
equal those of full-precision KV, and the mean length of the common prefix.
Nothing here asserts.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import re
import time

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.model.kv_calibrate import stream_nll
from pacer.model.runner import executor_for
from pacer.request import SamplingParams

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
DTYPES = ["auto", "int8", "fp8_e4m3", "fp8_e5m2"]


def readme_paragraphs() -> list[str]:
    text = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)
    # not the section that reports these results (it was written after them)
    text = re.sub(r"## KV memory.*?(?=\n## )", "", text, flags=re.S)
    paras = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith(("|", "#", "    "))]
        para = " ".join(ln.strip() for ln in lines)
        if len(para.split()) >= 25:
            paras.append(para)
    return paras


def engine_for(base: Engine, kv_cache_dtype: str, calibrate: bool = False) -> Engine:
    cfg = EngineConfig.from_kwargs(num_kv_blocks=512, kv_cache_dtype=kv_cache_dtype, calculate_kv_scales=calibrate)
    ex = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
    return Engine(cfg, ex, base.tokenizer, ex.num_blocks, base.max_model_len, base.eos_token_ids,
                  vocab_size=base.vocab_size)


def greedy(engine: Engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    ids = {engine.add_request(p, params): i for i, p in enumerate(prompts)}
    out: list[list[int]] = [[] for _ in prompts]
    for o in engine.run_until_done():
        out[ids[o.request_id]] = list(o.token_ids)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="longer windows and every paragraph")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    base = Engine.from_kwargs(num_kv_blocks=16, num_threads=args.threads)
    model, tok = base.executor.model, base.tokenizer
    paras = readme_paragraphs()
    stream = [t for p in paras for t in tok.encode(" " + p)]
    text = stream if args.full else stream[:4096]
    window = 1024
    windows = [text[i:i + window] for i in range(0, len(text), window) if len(text[i:i + window]) > 64]
    n_prompts = 64 if args.full else 32
    step = (len(stream) - 48) // n_prompts
    prompts = [stream[i * step:i * step + 48] for i in range(n_prompts)]
    print(f"README prose: {len(paras)} paragraphs, {len(stream)} tokens; {len(windows)} windows of <= {window}; "
          f"{len(prompts)} greedy prompts; loadavg {os.getloadavg()[0]:.2f}")
    ref_nll = None
    ref_out: list[list[int]] = []
    variants = [(d, False) for d in DTYPES] + [("fp8_e4m3", True), ("fp8_e5m2", True)]
    for name, calibrate in variants:
        t0 = time.perf_counter()
        eng = engine_for(base, name, calibrate)
        fmt = eng.executor.kv_format
        nll = [x for w in windows for x in stream_nll(model, w, fmt, chunk=256)]
        ppl = math.exp(sum(nll) / len(nll))
        outs = greedy(eng, prompts, 32)
        label = name + (" (calibrated scales)" if calibrate else " (scale 1.0)" if name.startswith("fp8") else "")
        if ref_nll is None:
            ref_nll, ref_ppl, ref_out = nll, ppl, outs
            print(f"  {label:<30} perplexity {ppl:8.4f}   (reference)   {time.perf_counter() - t0:5.1f}s")
            continue
        same = sum(a == b for a, b in zip(outs, ref_out)) / len(outs)
        prefix = sum(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
                     for a, b in zip(outs, ref_out)) / len(outs)
        print(f"  {label:<30} perplexity {ppl:8.4f}   {100 * (ppl / ref_ppl - 1):+6.2f}% vs auto   "
              f"greedy-32 identical {same:5.1%}   mean common prefix {prefix:4.1f}/32   "
              f"{time.perf_counter() - t0:5.1f}s")


if __name__ == "__main__":
    main()
