"""How fast `pacer sim` runs (issue 26 item 5): 10,000 requests on H200 x8 in under 10 s here.

The run is `pacer sim`'s own code path (`build_specs`, `build_sim_engine`, `simulate`,
`build_report`) for

    pacer sim --hardware h200-sxm --tp 8 --model llama-3.1-70b --workload mixed \
        --request-rate 20 --num-prompts 10000 --max-num-batched-tokens 8192

and prints its wall time, its user CPU time (`resource.getrusage`, less sensitive to other work
on a shared machine), requests/s, steps, request-steps (the rows of all steps) and microseconds
per request-step, beside the load average and the CPU flags; then a digest of the run's results
(every request's timestamps and counts, and the report's summary), so a speed-up that changed a
scheduling decision shows as a different digest.

`--compare-src DIR` runs the same thing from another source tree (e.g. an older commit's `src`,
`git archive <commit> src | tar -x -C /tmp/old`) in child processes, interleaved with this
tree's, and prints the ratios of the medians and whether the digests agree.

Run: PYTHONPATH=src python benchmarks/sim_speed.py [--num-prompts 10000] [--repeat 1]
     [--compare-src /tmp/old/src]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ARGV = ("--hardware h200-sxm --tp 8 --model llama-3.1-70b --workload mixed --request-rate 20 "
        "--max-num-batched-tokens 8192")


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    return ",".join(x for x in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if x in flags) or "none"


def loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def digest(records: list[Any], summary: dict[str, Any]) -> str:
    """sha256 over every request's outcome (all timestamps, token times included) and the summary."""
    h = hashlib.sha256()
    for r in records:
        d = r.as_dict()
        d["token_times"] = r.token_times
        h.update(json.dumps(d, sort_keys=True, default=str).encode())
    h.update(json.dumps(summary, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def run_once(num_prompts: int, extra_argv: str = "") -> dict[str, Any]:
    """One simulation as `pacer sim` runs it; the engine build and the trace are not timed."""
    from pacer.config import EngineConfig
    from pacer.config.args import engine_kwargs_from_args
    from pacer.perf.profiles import get_hardware, get_model
    from pacer.sim.cli import add_args, build_specs
    from pacer.sim.simulator import build_sim_engine, simulate
    from pacer.workload.report import OVERALL, build_report

    p = argparse.ArgumentParser()
    add_args(p)
    args = p.parse_args(f"{ARGV} --num-prompts {num_prompts} {extra_argv}".split())
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    hw, model = get_hardware(args.hardware), get_model(args.model)
    engine, executor, clock = build_sim_engine(config, hw, model, tp=args.tp,
                                               gpu_memory_utilization=args.gpu_memory_utilization)
    specs, _, _ = build_specs(args, float(args.request_rate), engine.max_model_len)
    load = loadavg()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    result = simulate(engine, executor, clock, specs)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    report = build_report(result.records)
    rows = sum(s.batch_size for s in result.steps)
    return {"requests": len(result.records), "wall_s": result.wall_s, "user_s": ru1.ru_utime - ru0.ru_utime,
            "steps": result.num_steps, "request_steps": rows, "sim_s": result.sim_duration_s,
            "digest": digest(result.records, report.summary),
            "out_tok_s": report.summary[OVERALL]["output_tok_s"], "load_before": load, "load_after": loadavg()}


def line(tag: str, r: dict[str, Any]) -> str:
    return (f"{tag}: {r['requests']} requests on H200x8 (llama-3.1-70b, mixed, 20 req/s): "
            f"wall {r['wall_s']:.2f} s, user CPU {r['user_s']:.2f} s, {r['requests'] / r['wall_s']:.0f} requests/s, "
            f"{r['steps']} steps, {r['request_steps']} request-steps, "
            f"{r['wall_s'] / r['request_steps'] * 1e6:.2f} us/request-step wall "
            f"({r['user_s'] / r['request_steps'] * 1e6:.2f} user), {r['sim_s']:.1f} simulated s, "
            f"digest {r['digest']} | load {r['load_before']} -> {r['load_after']}, cpu {cpu_flags()}")


def child(src: str, num_prompts: int, extra_argv: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=src)
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import sim_speed, json; "
            f"print(json.dumps(sim_speed.run_once({num_prompts}, {extra_argv!r})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=1, help="runs per source tree (interleaved)")
    ap.add_argument("--compare-src", default=None, help="another source tree to run side by side (its src dir)")
    ap.add_argument("--extra", default="", help="more pacer sim flags for both sides")
    a = ap.parse_args()
    print(f"pacer sim {ARGV} --num-prompts {a.num_prompts} {a.extra}".rstrip())
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load {loadavg()}, cpu {cpu_flags()}, "
          f"{os.cpu_count()} cpus")
    here = str(Path(__file__).resolve().parent.parent / "src")
    sides = {"this": here} if a.compare_src is None else {"base": a.compare_src, "this": here}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for i in range(a.repeat):
        for tag, src in sides.items():
            r = child(src, a.num_prompts, a.extra) if a.compare_src is not None else run_once(a.num_prompts, a.extra)
            runs[tag].append(r)
            print(line(f"{tag} #{i + 1}", r), flush=True)
    for tag, rs in runs.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        user = statistics.median(r["user_s"] for r in rs)
        verdict = "" if a.num_prompts != 10_000 else f" ({'under' if wall < 10 else 'over'} the 10 s target)"
        print(f"{tag} median: wall {wall:.2f} s{verdict}, user CPU {user:.2f} s")
    # this tree's medians (the loop's last side), for cpu_verdicts.py
    print("RESULT " + json.dumps({"requests": a.num_prompts, "wall_s": wall, "user_s": user}))
    if a.compare_src is not None:
        b, t = runs["base"], runs["this"]
        wall_ratio = statistics.median(x["wall_s"] for x in b) / statistics.median(x["wall_s"] for x in t)
        user_ratio = statistics.median(x["user_s"] for x in b) / statistics.median(x["user_s"] for x in t)
        same = {x["digest"] for x in b} == {x["digest"] for x in t} and len({x["digest"] for x in b + t}) == 1
        print(f"speed-up this vs base: wall {wall_ratio:.2f}x, user CPU {user_ratio:.2f}x; "
              f"results {'identical' if same else 'DIFFERENT'} (digest {t[0]['digest']} vs {b[0]['digest']})")


if __name__ == "__main__":
    main()
