"""`pacer tune`: the seeds' batch-limit method on the simulator, step by step (default), or the
grid search (`--grid`).

The method (`pacer.tune.method`): (1) the SLA from `--slo`; (2) the traffic's prompt/output
CV, from the workload, a trace, or `--from-log` (anything `pacer diagnose` reads); (3) the largest
`max_num_seqs` before KV pressure (the knee); (4) `max_num_batched_tokens` under it; (5) chunked
prefill on or off against the SLA. `--verify` runs the chosen configuration, the runner-up and the
out-of-the-box defaults on the real engine (in-process, or `--base-url`) on the same trace.

The grid: for each configuration the same seeded trace runs through the real scheduler on simulated
hardware (`pacer.sim`). At one offered rate the configurations are ranked by SLO attainment, then
goodput (requests per second that met every SLO), then p99 TTFT. With `--find-max-rate` each configuration
gets a capacity search instead: the highest Poisson rate at which the SLO attainment stays
>= `--target-attainment` (bisection over simulated runs), and the ranking is by that capacity.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from pacer.config.args import add_engine_args, engine_kwargs_from_args

__all__ = ["add_args", "run", "TuneResult", "parse_int_list"]


@dataclass(frozen=True, slots=True)
class TuneResult:
    max_num_seqs: int
    max_num_batched_tokens: int
    rate: float
    summary: dict[str, Any]

    @property
    def goodput(self) -> float:
        return float(self.summary.get("goodput_req_s") or 0.0)

    @property
    def attainment(self) -> float:
        return float(self.summary.get("slo_attainment") or 0.0)


def parse_int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name}: expected integers such as 32,64,128, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{name}: expected integers >= 1, got {text!r}")
    return values


def add_args(p: argparse.ArgumentParser) -> None:
    from pacer.sim.cli import add_workload_args

    p.description = ("The seeds' tuning method on the simulator: SLA, traffic CV, the max_num_seqs knee, "
                     "max_num_batched_tokens, chunked prefill; --verify on the real engine; --grid for a grid.")
    m = p.add_argument_group("method")
    m.add_argument("--grid", action="store_true", help="the grid search over both lists instead of the method")
    m.add_argument("--from-log", action="append", default=[], metavar="SOURCE",
                   help="take the traffic from a request log, run file or table (as pacer diagnose reads it)")
    m.add_argument("--verify", action="store_true",
                   help="run the chosen config, the runner-up and the defaults on the real engine (in-process)")
    m.add_argument("--no-refit", dest="refit", action="store_false",
                   help="--verify in-process: keep the hardware's saved calibration (by default the defaults run "
                        "first and the method predicts with step times refitted on its measured steps)")
    m.add_argument("--base-url", default=None, help="--verify against this server instead (restart it with the "
                                                    "printed flags first)")
    g = p.add_argument_group("sweep")
    g.add_argument("--max-num-seqs", default=None, help="comma list to sweep (method: 1,2,4,...,256; grid: "
                                                        "16,32,64,128,256)")
    g.add_argument("--max-num-batched-tokens", default=None,
                   help="comma list to sweep (method: 256,...,8192; grid: 512,...,8192)")
    g.add_argument("--find-max-rate", action="store_true",
                   help="per config, bisect the highest request rate meeting the SLO (capacity search)")
    g.add_argument("--target-attainment", type=float, default=0.9,
                   help="fraction of requests that must meet the SLO (default 0.9)")
    g.add_argument("--max-rate", type=float, default=64.0, help="capacity search: upper bound, req/s")
    h = p.add_argument_group("simulated hardware")
    h.add_argument("--hardware", default="cpu-local", help="a100-80g | h100-sxm | h200-sxm | b200 | cpu-local")
    h.add_argument("--tp", type=int, default=1, help="tensor-parallel devices")
    h.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of device memory for weights + KV (GPU profiles)")
    add_workload_args(p)
    add_engine_args(p, skip=("seed", "max_num_seqs", "max_num_batched_tokens"))


class _Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        from pacer.perf.profiles import get_hardware, get_model
        from pacer.workload.report import parse_slo

        self.args = args
        self.hw, self.model = get_hardware(args.hardware), get_model(args.model)
        self.kwargs = {k: v for k, v in engine_kwargs_from_args(args).items()
                       if k not in ("max_num_seqs", "max_num_batched_tokens")}   # the swept lists
        self.slo = parse_slo(args.slo)
        if self.slo.is_empty():
            raise ValueError("pacer tune needs an SLO, e.g. --slo ttft=400ms,tpot=50ms")

    def run(self, seqs: int, budget: int, rate: float | None) -> TuneResult:
        from pacer.config import EngineConfig
        from pacer.sim.cli import build_specs
        from pacer.sim.simulator import build_sim_engine, simulate
        from pacer.workload.report import OVERALL, build_report

        cfg = EngineConfig.from_kwargs(**self.kwargs, max_num_seqs=seqs, max_num_batched_tokens=budget)
        engine, ex, clock = build_sim_engine(cfg, self.hw, self.model, tp=self.args.tp,
                                             gpu_memory_utilization=self.args.gpu_memory_utilization,
                                             keep_records=False)
        specs, _, _ = build_specs(self.args, rate, engine.max_model_len)
        result = simulate(engine, ex, clock, specs, concurrency=self.args.concurrency)
        summary = build_report(result.records, slo=self.slo).summary[OVERALL]
        return TuneResult(seqs, budget, rate if rate is not None else math.nan, dict(summary))

    def capacity(self, seqs: int, budget: int) -> TuneResult | None:
        """Highest rate (to ~5%) whose attainment meets the target; None if even 1/64 of max fails."""
        target = self.args.target_attainment
        lo: TuneResult | None = None
        low, high = 0.0, float(self.args.max_rate)
        top = self.run(seqs, budget, high)
        if top.attainment >= target:
            return top
        rate = high / 2
        while high - low > 0.05 * high and rate > high / 64:
            r = self.run(seqs, budget, rate)
            if r.attainment >= target:
                lo, low = r, rate
            else:
                high = rate
            rate = (low + high) / 2
        return lo


def run(args: argparse.Namespace) -> int:
    if not args.grid:
        from pacer.tune.method_cli import run_method_cli

        seqs = parse_int_list(args.max_num_seqs, "--max-num-seqs") if args.max_num_seqs else None
        budgets = (parse_int_list(args.max_num_batched_tokens, "--max-num-batched-tokens")
                   if args.max_num_batched_tokens else None)
        return run_method_cli(args, seqs, budgets)
    return _run_grid(args)


def _run_grid(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from pacer.sim.cli import parse_rates

    seqs_list = parse_int_list(args.max_num_seqs or "16,32,64,128,256", "--max-num-seqs")
    budgets = parse_int_list(args.max_num_batched_tokens or "512,1024,2048,4096,8192", "--max-num-batched-tokens")
    runner = _Runner(args)
    chunked = runner.kwargs.get("enable_chunked_prefill", True)
    if not chunked:
        budgets = [b for b in budgets if b >= (args.max_model_len or runner.model.max_model_len)]
        if not budgets:
            raise ValueError("without chunked prefill max_num_batched_tokens must be >= max_model_len; "
                             "sweep larger budgets or lower --max-model-len")
    rates = parse_rates(args.request_rate, args.concurrency)
    if len(rates) != 1 and not args.find_max_rate:
        raise ValueError("pacer tune runs one --request-rate (or --find-max-rate)")
    results: list[TuneResult] = []
    for seqs in seqs_list:
        for budget in budgets:
            r = runner.capacity(seqs, budget) if args.find_max_rate else runner.run(seqs, budget, rates[0])
            if r is not None:
                results.append(r)
    key = (lambda r: (r.rate, r.goodput)) if args.find_max_rate else (
        lambda r: (round(r.attainment, 3), r.goodput, -(r.summary.get("ttft_p99") or math.inf)))
    results.sort(key=key, reverse=True)
    table = Table(title=f"pacer tune: {runner.model.name} on {runner.hw.name} x{args.tp}", title_justify="left")
    for col in ("max_num_seqs", "max_num_batched_tokens", "rate req/s", "goodput req/s", "SLO met",
                "out tok/s", "TTFT p99", "TPOT p99", "ITL p99"):
        table.add_column(col, justify="right")

    def ms(v: Any) -> str:
        return "-" if v is None else f"{v * 1000:.1f} ms"

    for r in results:
        s = r.summary
        table.add_row(str(r.max_num_seqs), str(r.max_num_batched_tokens), f"{r.rate:g}", f"{r.goodput:.2f}",
                      f"{r.attainment * 100:.1f}%", f"{s['output_tok_s']:.0f}", ms(s["ttft_p99"]),
                      ms(s["tpot_p99"]), ms(s["itl_p99"]))
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 140))
    console.print(table)
    if not results:
        print("no configuration met the SLO at any searched rate")
        return 1
    best = results[0]
    print(f"best: --max-num-seqs {best.max_num_seqs} --max-num-batched-tokens {best.max_num_batched_tokens}"
          + (f" (capacity {best.rate:g} req/s at {args.target_attainment * 100:g}% SLO attainment)"
             if args.find_max_rate else f" (goodput {best.goodput:.2f} req/s)"))
    return 0

