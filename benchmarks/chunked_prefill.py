"""Evidence that chunked prefill is a latency policy: short chats mixed with ~1,500-token prompts.

Runs the same seeded workload (Poisson arrivals at a fixed rate; a few long prompts among
short chats) on an in-process engine with the default model twice: chunked prefill on (a
small token budget per step, decode-first) and off (each prompt prefilled whole in its own
step). Prints the short chats' ITL p99 and TTFT p50 for both, and throughput. Without
chunking every decode in flight stalls for a whole 1,500-token prefill; with it, a decode
waits at most one step of `--chunk` tokens. Target: ITL p99 on <= 1/3 of off, throughput
within 10%.

Why the mix is 40% long prompts: with whole-prompt prefill, a chat's gap is stalled only when a
long prefill lands inside it, so the stalled share of all chat gaps is about (long-prompt
rate) x (decode step time), whatever the number of chats. ITL p99 sees the stalls only when
that share is above 1%; on a CPU, where a 1,500-token prefill costs ~50 decode steps, that
takes a long-prompt rate close to what the engine can prefill. (Chunking spreads each stall
over ~6 smaller ones, so with too few long prompts p99 shows the chunks but not the stalls,
and chunking looks worse at p99 while still removing the multi-second gaps.)

    .venv/bin/python benchmarks/chunked_prefill.py [--rate 0.5] [--num-requests 24] [--chunk 256]
        [--out DIR]   # keeps both runs as pacer bench JSON: `pacer bench compare DIR/off.json DIR/on.json`

Numbers depend on the machine and its load; nothing here asserts.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import Any

from pacer.engine import Engine
from pacer.request import SamplingParams
from pacer.workload.arrivals import Poisson
from pacer.workload.generator import generate_requests
from pacer.workload.report import OVERALL, Report, build_report
from pacer.workload.runner import run_inprocess
from pacer.workload.spec import ClassSpec, LengthDist, RequestSpec, Workload


def workload(args: argparse.Namespace) -> Workload:
    long = ClassSpec("long", LengthDist(args.long_len), LengthDist(args.long_output), weight=args.long_fraction)
    chat = ClassSpec("chat", LengthDist(args.chat_len, 0.3), LengthDist(args.chat_output),
                     weight=1.0 - args.long_fraction)
    return Workload("chunked-prefill-mix", (long, chat))


def warm_up(engine: Engine, long_len: int) -> None:
    """One long and a few short requests, so one-off costs (allocations, kernels) stay out of the run."""
    for n, out in ((long_len, 4), (32, 8), (32, 8)):
        engine.add_request(list(range(1000, 1000 + n)), SamplingParams(max_tokens=out, ignore_eos=True))
    engine.run_until_done()


def run(specs: list[RequestSpec], chunked: bool, args: argparse.Namespace) -> Report:
    kwargs: dict[str, Any] = {"enable_chunked_prefill": chunked, "max_model_len": args.max_model_len}
    if chunked:
        kwargs["max_num_batched_tokens"] = args.chunk
    if args.num_threads:
        kwargs["num_threads"] = args.num_threads
    engine = Engine.from_kwargs(**kwargs)
    warm_up(engine, args.long_len)
    records, _, stats = run_inprocess(specs, engine)
    meta = {"engine": "inprocess", "engine_args": kwargs, "workload": "chunked-prefill-mix",
            "arrivals": f"poisson @ {args.rate:g} req/s", "seed": args.seed, "engine_steps": stats.as_dict()}
    del engine
    gc.collect()
    return build_report(records, meta=meta)


def line(label: str, rep: Report) -> str:
    chat, overall = rep.summary["chat"], rep.summary[OVERALL]
    worst_gap = max((g for r in rep.records if r.request_class == "chat" for g in r.itl), default=None)
    return (f"{label}: short chats ITL p99 {_ms(chat['itl_p99'])}, TTFT p50 {_ms(chat['ttft_p50'])}"
            f" (ITL p50 {_ms(chat['itl_p50'])}, max {_ms(worst_gap)})"
            f" | throughput {overall['total_tok_s']:.1f} tok/s total, {overall['output_tok_s']:.1f} output tok/s,"
            f" {overall['num_ok']}/{overall['num_requests']} ok in {overall['duration_s']:.1f} s")


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{v * 1000:.1f} ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=0.5, help="arrival rate, req/s (default 0.5)")
    p.add_argument("--num-requests", type=int, default=20)
    p.add_argument("--long-fraction", type=float, default=0.4, help="share of ~1,500-token prompts (default 0.4)")
    p.add_argument("--long-len", type=int, default=1500)
    p.add_argument("--long-output", type=int, default=8)
    p.add_argument("--chat-len", type=int, default=64)
    p.add_argument("--chat-output", type=int, default=32)
    p.add_argument("--chunk", type=int, default=256, help="max_num_batched_tokens with chunked prefill")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--num-threads", type=int, default=1,
                   help="torch threads (default 1: on a small shared box, contending threads are far slower)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="directory for on.json / off.json (pacer bench compare)")
    args = p.parse_args()

    t_start = time.perf_counter()
    from pacer.model.loader import default_model_path
    from pacer.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(default_model_path())
    specs = generate_requests(workload(args), Poisson(args.rate), seed=args.seed, num_requests=args.num_requests,
                              tokenizer=tokenizer, max_model_len=args.max_model_len)
    n_long = sum(1 for s in specs if s.request_class == "long")
    print(f"workload: {len(specs)} requests at {args.rate:g} req/s (Poisson, seed {args.seed}): {n_long} x "
          f"{args.long_len}-token prompts, {len(specs) - n_long} short chats (~{args.chat_len} prompt / "
          f"{args.chat_output} output tokens); arrivals over {specs[-1].arrival_time or 0:.1f} s", flush=True)
    reports = {}
    for chunked in (True, False):
        reports[chunked] = run(specs, chunked, args)
        label = f"chunked prefill ON  (max_num_batched_tokens={args.chunk})" if chunked else \
                "chunked prefill OFF (whole prompts, prefill-only steps)   "
        print(line(label, reports[chunked]), flush=True)
    on, off = reports[True].summary, reports[False].summary
    itl_on, itl_off = on["chat"]["itl_p99"], off["chat"]["itl_p99"]
    tput_on, tput_off = on[OVERALL]["total_tok_s"], off[OVERALL]["total_tok_s"]
    if itl_on is not None and itl_off and tput_on is not None and tput_off:
        ratio = float(itl_on) / float(itl_off)
        tput = float(tput_on) / float(tput_off)
        print(f"ITL p99 on/off = {ratio:.2f} (target <= 0.33: {'met' if ratio <= 1 / 3 else 'NOT met'}); "
              f"throughput on/off = {tput:.2f} (target within 10%: {'met' if abs(tput - 1) <= 0.10 else 'NOT met'})")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        reports[True].save(out / "on.json")
        reports[False].save(out / "off.json")
        print(f"wrote {out / 'on.json'} and {out / 'off.json'} (pacer bench compare {out}/off.json {out}/on.json)")
    print(f"total time {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
