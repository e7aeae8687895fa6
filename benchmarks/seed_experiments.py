"""The seed articles' experiments, reproduced on pacer's simulator and printed beside their figures.

    .venv/bin/python benchmarks/seed_experiments.py [--quick] [--only 1,2,3,4]

1. A100-80GB, Llama-3-8B fp16, input 512 / output 128, all requests arriving together,
   chunked prefill off: sweep max_num_seqs 1..128 (one wave of max_num_seqs requests, the
   setting in which the seed's "the last request waits for 63 prefills" holds), at 0.9 and at
   0.3 gpu_memory_utilization (to find the KV knee).
2. Same model and shape, max_num_seqs 64, chunked prefill on: sweep max_num_batched_tokens.
3. max_num_seqs 32, output-length CV 0.1 vs 1.5 (seed: TPOT p99 22.4 vs 87.3 ms).
4. H200 x8, Llama-3.1-70B, mixed traffic, chunked prefill + prefix caching (the seed's vLLM
   config: max_num_batched_tokens 8192, max_num_seqs 256): the highest Poisson rate whose p99
   TTFT stays <= 400 ms, and the aggregate tok/s there (seed: >= 2,500 tok/s).

Every number comes from the real pacer scheduler driven by the roofline cost model of
`pacer.sim` (datasheet peaks x efficiency, no tuning to these seeds). Nothing here asserts.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from pacer.bench.arrivals import make_arrivals
from pacer.bench.report import OVERALL, build_report
from pacer.bench.workloads import builtin_workload, generate_requests
from pacer.config import EngineConfig
from pacer.sim.profiles import get_hardware, get_model
from pacer.sim.simulator import build_sim_engine, simulate

A100, H200 = "a100-80g", "h200-sxm"


def run(hw: str, model: str, *, n: int, rate: float = math.inf, input_len: int | None = 512,
        output_len: int | None = 128, output_cv: float | None = None, workload: str = "fixed", tp: int = 1,
        mem_util: float = 0.9, seed: int = 0, **engine: Any) -> dict[str, Any]:
    m = get_model(model)
    cfg = EngineConfig.from_kwargs(dtype=engine.pop("dtype", "float16" if hw == A100 else "bfloat16"), **engine)
    eng, ex, clock = build_sim_engine(cfg, get_hardware(hw), m, tp=tp, gpu_memory_utilization=mem_util)
    wl = builtin_workload("fixed", input_len, output_len) if workload == "fixed" else builtin_workload(workload)
    if output_cv is not None:
        wl = wl.with_lengths(output_cv=output_cv)
    specs = generate_requests(wl, make_arrivals(rate), seed=seed, num_requests=n, max_model_len=m.max_model_len)
    res = simulate(eng, ex, clock, specs)
    s = dict(build_report(res.records).summary[OVERALL])
    decode_s = sum(st.forward_s for st in res.steps if not st.num_prefill_tokens)
    decode_tokens = sum(st.num_decode_tokens for st in res.steps if not st.num_prefill_tokens)
    s.update(decode_tok_s=decode_tokens / decode_s if decode_s else 0.0, preempt=res.num_preemptions, kv_blocks=res.num_kv_blocks, wall=res.wall_s, steps=res.num_steps)
    return s


def ms(v: float | None) -> str:
    return "    -" if v is None else f"{v * 1000:7.1f}"


def exp1(quick: bool) -> None:
    print("\n== 1. A100-80GB, Llama-3-8B fp16, 512 in / 128 out, all at once, chunked prefill off ==")
    seeds = {1: (23, 9.1, 11.4, 128), 64: (1380, 14.6, 52, 4891), 128: (None, None, 148.3, 6240)}
    sweep = [1, 8, 32, 64, 128] if quick else [1, 2, 4, 8, 16, 32, 64, 128]
    for label, mem in (("gpu_memory_utilization 0.9 (~52 GB of KV)", 0.9),
                       ("gpu_memory_utilization 0.3 (~7 GB of KV): where the KV knee appears", 0.3)):
        print(f"\n  {label}")
        print("  seqs |  TTFT p50  TTFT p99 |  TPOT p50  TPOT p99 | out tok/s | decode-only tok/s | preempt |"
              " seed: TTFT p50  TPOT p50  TPOT p99  tok/s")
        for seqs in sweep:
            s = run(A100, "llama-3-8b", n=seqs, max_num_seqs=seqs, enable_chunked_prefill=False, mem_util=mem)
            seed = seeds.get(seqs)
            seed_txt = "" if seed is None or mem != 0.9 else (
                f"  {seed[0] if seed[0] is not None else '-':>13}  {seed[1] if seed[1] is not None else '-':>8}"
                f"  {seed[2]:>8}  {seed[3]:>5}")
            print(f"  {seqs:4d} | {ms(s['ttft_p50'])}   {ms(s['ttft_p99'])} |  {ms(s['tpot_p50'])}  {ms(s['tpot_p99'])} |"
                  f" {s['output_tok_s']:9.0f} | {s['decode_tok_s']:17.0f} | {s['preempt']:7d} |{seed_txt}")
    print("""
  Differences, one sentence each:
  - TTFT at max_num_seqs=1 (33 ms vs 23 ms): a 512-token prefill of an 8B model is ~7.7 TFLOP,
    >= 25 ms even at the A100's full 312 TFLOP/s fp16 peak, so the seed's 23 ms is faster than
    the hardware allows; ours assumes 70% of peak.
  - TTFT at 64 (1,323 ms vs 1,380 ms) agrees: without chunked prefill the step budget is
    max_model_len = 8,192 tokens, so 64 prompts go in four 16-prompt prefill steps (~0.55 s each)
    and the median request waits for two -- the seed's "linear in batch size" is this staircase.
  - TPOT p50 at 64 (18 ms vs 14.6 ms): a pure decode step of 64 is 11.9 ms here (weights read once,
    plus each sequence's KV), but the first-admitted requests then wait through the other prefill
    steps, which lands in their TPOT; the seed's figure matches a decode step plus a smaller stall.
  - Throughput (2,260 vs 4,891 tok/s at 64): a one-wave run spends half its time in prefill; the
    decode-only rate (output tokens / time in decode steps) is ~5,000 tok/s, which is what the
    seed's 4,891 -> 6,240 looks like, i.e. the seed's throughput excludes prefill time.
  - The TPOT p99 knee from KV exhaustion does not happen on an 80 GB A100 at 0.9 utilisation:
    128 x 640 tokens x 128 KiB = 10.7 GB of KV against ~52 GB free, so nothing is preempted or
    swapped. With a ~7 GB KV budget (0.3) the scheduler does preempt at 128 (recompute), but the
    cost lands on TTFT p99 (4.2 -> 6.7 s) and throughput (2,673 -> 2,038 tok/s), not on TPOT p99:
    the victims are the latest admitted, which have produced few tokens. Our TPOT p99 at 64 -> 128
    (24 -> 44 ms) rises from prefill stalls, not KV; the seed's 148 ms knee needs swap traffic and
    a memory limit it does not state.""")


def exp2(quick: bool) -> None:
    print("\n== 2. Same model and one wave of 64, max_num_seqs 64: chunked prefill off, then on with a budget sweep ==")
    print("  budget        |  TTFT p50  TTFT p99 |  TPOT p50  TPOT p99 |  ITL p99 | out tok/s")
    s = run(A100, "llama-3-8b", n=64, max_num_seqs=64, enable_chunked_prefill=False)
    print(f"  off (8192)    | {ms(s['ttft_p50'])}   {ms(s['ttft_p99'])} |  {ms(s['tpot_p50'])}  {ms(s['tpot_p99'])} |"
          f" {ms(s['itl_p99'])} | {s['output_tok_s']:9.0f}")
    for budget in ([512, 2048, 8192] if quick else [256, 512, 1024, 2048, 4096, 8192]):
        s = run(A100, "llama-3-8b", n=64, max_num_seqs=64, max_num_batched_tokens=budget,
                enable_chunked_prefill=True)
        print(f"  on {budget:6d}     | {ms(s['ttft_p50'])}   {ms(s['ttft_p99'])} |  {ms(s['tpot_p50'])}  {ms(s['tpot_p99'])} |"
              f" {ms(s['itl_p99'])} | {s['output_tok_s']:9.0f}")
    print("""
  The seed gives the direction without numbers ("chunked prefill lowers TTFT a lot; a smaller
  chunk lowers it further but raises TPOT p50 slightly"). Here, with the whole wave arriving at
  once, the prefill work is fixed, so chunking only trims the median TTFT (~15% at a 1,024
  budget) and a very small budget raises TTFT p99 (more, cheaper steps); TPOT p50 does not rise
  as the budget shrinks, because a step carrying fewer prefill tokens is shorter. What the budget
  really sets is the decode stall: ITL p99 grows linearly with it (~20 ms at 256, ~530 ms at
  8,192), the trade-off the seed attributes to TPOT p50.""")


def exp3(quick: bool) -> None:
    print("\n== 3. max_num_seqs 32, output-length CV 0.1 vs 1.5 (A100, Llama-3-8B, 512 in, mean 128 out) ==")
    n = 256 if quick else 512
    print("  CV  | prefill            |  TPOT p50  TPOT p99 | preempt | out tok/s | seed TPOT p99")
    seed = {0.1: 22.4, 1.5: 87.3}
    for label, kw in (("whole (chunked off)", {"enable_chunked_prefill": False}),
                      ("chunks of 2048", {"enable_chunked_prefill": True}),
                      ("chunks of 256", {"enable_chunked_prefill": True, "max_num_batched_tokens": 256})):
        for cv in (0.1, 1.5):
            s = run(A100, "llama-3-8b", n=n, output_cv=cv, max_num_seqs=32, **kw)
            seed_txt = str(seed[cv]) if not kw["enable_chunked_prefill"] else ""
            print(f"  {cv:3.1f} | {label:18s} |  {ms(s['tpot_p50'])}  {ms(s['tpot_p99'])} | {s['preempt']:7d} |"
                  f" {s['output_tok_s']:9.0f} | {seed_txt:>8}")
    print("""
  The TPOT p99 gap reproduces (20 vs ~110 ms here, 22.4 vs 87.3 ms in the seed), but not for
  the seed's reason: nothing is preempted and the KV cache stays far from full. With CV 1.5 the
  gamma draws many outputs of a handful of tokens; such a request's TPOT averages only a few
  gaps, and one of them usually contains a prefill step (a whole 16-prompt step, or a 2,048-token
  chunk of ~140 ms on this GPU), so the p99 is the prefill step's length. A 256-token budget caps
  that step and with it the p99 -- the tail is prefill interference seen through short outputs.""")


def exp4(quick: bool) -> None:
    print("\n== 4. H200 x8, Llama-3.1-70B bf16, mixed traffic, chunked prefill + prefix caching ==")
    print("  (max_num_batched_tokens 8192, max_num_seqs 256, gpu_memory_utilization 0.92)")
    print("  rate req/s | out tok/s  total tok/s | TTFT p50  TTFT p99 | TPOT p99 | cache hit | ok (p99 TTFT <= 400 ms)")
    best = None
    n = 600 if quick else 1500
    for rate in ([10, 20, 30] if quick else [5, 10, 15, 20, 25, 30, 35, 40]):
        s = run(H200, "llama-3.1-70b", n=n, rate=rate, workload="mixed", input_len=None, output_len=None, tp=8,
                mem_util=0.92, max_num_batched_tokens=8192, max_num_seqs=256, enable_chunked_prefill=True,
                enable_prefix_caching=True)
        ok = s["ttft_p99"] is not None and s["ttft_p99"] <= 0.4
        if ok:
            best = (rate, s)
        print(f"  {rate:10g} | {s['output_tok_s']:9.0f}  {s['total_tok_s']:11.0f} | {ms(s['ttft_p50'])}  {ms(s['ttft_p99'])} |"
              f"  {ms(s['tpot_p99'])} | {s['cache_hit_rate'] * 100:8.1f}% | {'yes' if ok else 'no'}")
    if best is None:
        print("\n  no rate in the sweep kept p99 TTFT <= 400 ms")
        return
    rate, s = best
    verdict = "holds" if s["output_tok_s"] >= 2500 else "does not hold for output tokens"
    print(f"""
  Highest rate with p99 TTFT <= 400 ms: {rate:g} req/s, {s['output_tok_s']:.0f} output tok/s
  ({s['total_tok_s']:.0f} tok/s counting prompt tokens). The seed's claim (>= 2,500 tok/s at p99
  TTFT <= 400 ms) {verdict} on this mix, with margin for what a roofline leaves out (it assumes
  70% of peak FLOP/s and 85% of HBM bandwidth, and no host-side stalls at 256 sequences);
  "aggregate tok/s" is ambiguous in the seed, and counting prompt tokens multiplies it by ~6 on
  this prompt-heavy mix. Past the knee, p99 TTFT climbs fast: the queue, not the GPU, sets it.""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sweep points")
    ap.add_argument("--only", default="1,2,3,4", help="comma list of experiments to run")
    args = ap.parse_args()
    t0 = time.perf_counter()
    exps = {"1": exp1, "2": exp2, "3": exp3, "4": exp4}
    for key in args.only.split(","):
        exps[key.strip()](args.quick)
    print(f"\n(simulated in {time.perf_counter() - t0:.1f} s wall)")


if __name__ == "__main__":
    main()
