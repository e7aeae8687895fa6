"""The slo policy on a machine that cannot meet its targets (issue 25), measured from outside.

For each engine (`pacer serve` fcfs, `pacer serve` slo, and `vllm serve` when its venv is
given) one server is started, then `pacer bench` sends it the same seeded `mixed` trace at
each rate over HTTP (one server, one client, the rates in turn); `pacer sim` with this
machine's `cpu-local` profile predicts each pacer line on the same trace, printed beside it.
Per engine and rate: output tok/s, goodput, attainment, refusals, and per class TTFT / ITL
p50 / p99. Then the issue's verdicts at each rate: past saturation, slo's throughput vs
fcfs's, goodput vs fcfs's and vLLM's, chat TTFT p50 and chat ITL p99; at a load the machine can
serve, its attainment (fcfs's + 0.2, or both >= 0.9), printed on every line (the ITL rows: chat
is the class a tight ITL target binds; every class's pooled ITL p99 is printed beside it, where
the long decodes of rag and batch, fcfs's and slo's alike, dilute a few stalls below the p99
that the chat streams see). `--policies fcfs` runs only the
default `pacer serve` (no verdicts: the online throughput check of `cpu_verdicts.py`). The last
line, `RESULT {...}`, holds every engine's overall figures per rate and seed as JSON.

`--repeats N` runs every trace N times, each repeat on freshly started servers (empty caches) with
the engines taking turns, pacer's two in reverse order every other repeat and vLLM's last, then
first, every other two (`_order`), so a drift in the machine's load falls on all of them alike.
pacer's two servers are up together (started and warmed one after the other) and take each trace
back to back, which first alternating from trace to trace (`_turns`): a slo / fcfs ratio compares
two runs seconds apart, where this machine's slow spells last about a minute (`--serial`: each
server up alone through every trace, as before 2026-12-06's seventh session). The tables then show
each repeat, and the verdicts are judged on the medians over the repeats (each figure's own
median), with how many single repeats agree and, for throughput, each repeat's own slo / fcfs
ratio.

    .venv/bin/python benchmarks/slo_overload.py                       # rates 0.1,0.3,0.6; seed 1
    .venv/bin/python benchmarks/slo_overload.py --vllm /tmp/pacer-peers/vllm-venv \\
        --vllm-model /tmp/pacer-peers/smollm2-hf --seeds 1,2,3

`--step-log` has each pacer server write its step log (`pacer serve --step-log`) and prices every
run's steps with this machine's fit (pacer.telemetry.step_log): the work each policy did in seconds
of the fit, and how fast the machine ran it (measured / fit), printed after the verdicts. A
throughput ratio mixes the two: the machine's speed swings by 10-20% between consecutive runs.

`pacer sim calibrate` first, at a quiet moment (the benchmark runs it when no fit is saved), so
the simulator's `cpu-local` profile and the slo servers' predictor are this machine's (the header
prints which fit and its error); `--sim-step-noise 0.14` predicts with the
step-time noise this machine showed (`pacer sim --step-noise`). The load average and the CPU's flags are
printed with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import isa_switch
from pacer.model.kernels import kernel_isa
from pacer.perf.cost_model import CostModel, make_cost_model
from pacer.perf.profiles import calibration_path, fit_is_trusted, get_hardware, get_model
from pacer.telemetry.step_log import priced_work_s, read_step_log
from slo_common import loadavg

TARGETS = ["chat:ttft=1s,itl=200ms", "rag:ttft=8s", "agent:ttft=3s,itl=300ms", "batch:e2e=120s"]
CLASSES = ("chat", "rag", "agent", "batch")
BIN = Path(sys.executable).parent


def _slo_flags() -> list[str]:
    return [x for t in TARGETS for x in ("--slo", t)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(cmd: list[str], port: int, log: Path, env: dict[str, str] | None = None,
           timeout_s: float = 900.0) -> Iterator[str]:
    """A server process, up once GET /v1/models answers; stopped (SIGINT, then kill) after, with
    every process it started (its own process group: vLLM's worker outlived its API server by
    ~2 s here, which the next engine's start would have shared the two cores with)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}; see {log}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{cmd[0]} did not come up in {timeout_s:.0f}s; see {log}") from None
                time.sleep(1.0)
        yield url
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[Any], timeout_s: float = 30.0) -> None:
    """SIGINT to the server's process group, SIGKILL to what is left of it after `timeout_s`;
    returns once no process of the group remains (or 5 s after the kill: what is left then is a
    zombie nobody reaps, which runs nothing)."""
    group = proc.pid   # start_new_session: the server leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGINT)
    deadline, killed = time.monotonic() + timeout_s, False
    while True:
        proc.poll()   # reap the leader
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            if killed:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
            deadline, killed = time.monotonic() + 5.0, True
        time.sleep(0.2)


def bench(url: str, rate: float, seed: int, n: int, out: Path, tokenizer: str | None) -> dict[str, Any]:
    cmd = [str(BIN / "pacer"), "bench", "--base-url", url, "--workload", "mixed", "--request-rate", str(rate),
           "--num-prompts", str(n), "--seed", str(seed), "--out", str(out), "--no-progress", *_slo_flags()]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return dict(json.loads(out.read_text())["summary"])


def simulate(policy: str, rate: float, seed: int, n: int, out: Path, noise: float = 0.0) -> dict[str, Any]:
    cmd = [str(BIN / "pacer"), "sim", "--hardware", "cpu-local", "--workload", "mixed", "--request-rate", str(rate),
           "--num-prompts", str(n), "--seed", str(seed), "--scheduling-policy", policy, "--out", str(out),
           "--step-noise", str(noise), *_slo_flags()]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)   # its regime log lines
    return dict(json.loads(out.read_text())["summary"])


def _f(v: Any, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v * scale)


def row(name: str, s: dict[str, Any]) -> str:
    o = s["overall"]
    cells = [f"{name:<14}", f"{_f(o['output_tok_s'], fmt='{:.1f}'):>6}", f"{_f(o['goodput_req_s'], fmt='{:.3f}'):>6}",
             f"{_f(o['slo_attainment']):>5}", f"{o['num_rejected']:>3}"]
    for c in CLASSES:
        cs = s.get(c)
        if cs is None:
            cells.append(f"{'':>29}")
            continue
        cells.append(f"{_f(cs['ttft_p50'], fmt='{:.1f}'):>5}/{_f(cs['ttft_p99'], fmt='{:.1f}'):>5}s "
                     f"{_f(cs['itl_p50'], 1e3, '{:.0f}'):>5}/{_f(cs['itl_p99'], 1e3, '{:.0f}'):>5}ms")
    return " ".join(cells)


HEADER = (f"{'engine':<14} {'tok/s':>6} {'good/s':>6} {'att':>5} {'429':>3} "
          + " ".join(f"{c + ' ttft p50/p99 itl p50/p99':>29}" for c in CLASSES))


def engines(args: argparse.Namespace, port: int) -> list[tuple[str, list[str], dict[str, str]]]:
    pacer = [str(BIN / "pacer"), "serve", "--host", "127.0.0.1", "--port", str(port), *_slo_flags(),
             *args.pacer_args.split()]
    out = [(f"pacer {policy}", [*pacer, "--scheduling-policy", policy], {}) for policy in args.policies.split(",")]
    if args.vllm:
        py = str(Path(args.vllm) / "bin" / "python")
        cmd = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", args.vllm_model, "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", "smollm2", *args.vllm_args.split()]
        env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{os.cpu_count() - 1 if os.cpu_count() else 0}",
               "VLLM_CPU_KVCACHE_SPACE": "4"}
        out.append(("vllm serve", cmd, env))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="0.1,0.3,0.6", help="req/s: under, at and past what the machine serves")
    p.add_argument("--seeds", default="1", help="trace seeds of the highest rate (a lower rate runs the first + 10 x "
                   "its distance from the top: no run repeats another's trace)")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--vllm", default=None, help="a vLLM-for-CPU venv (../shared/peers/setup.sh vllm)")
    p.add_argument("--vllm-model", default="/tmp/pacer-peers/smollm2-hf", help="the same weights as HF float32")
    p.add_argument("--vllm-args", default="--max-model-len 4096", help="extra vLLM server flags")
    p.add_argument("--pacer-args", default="", help="extra pacer serve flags (e.g. '--dtype bfloat16')")
    p.add_argument("--policies", default="fcfs,slo", help="pacer's scheduling policies, one server each (the "
                   "verdicts need fcfs and slo)")
    p.add_argument("--no-sim", action="store_true", help="skip the simulator's predictions")
    p.add_argument("--sim-step-noise", type=float, default=0.0, metavar="CV",
                   help="the simulator's `--step-noise` (this machine's steps scatter by ~0.14; 0: exact)")
    p.add_argument("--workdir", default=None, help="keep the run JSON and server logs here")
    p.add_argument("--step-log", action="store_true", help="pacer's servers log their steps; each run's work "
                   "is priced with this machine's fit and printed after the verdicts")
    p.add_argument("--repeats", type=int, default=1, help="runs of every trace, each on fresh servers; verdicts on "
                   "the medians")
    p.add_argument("--serial", action="store_true", help="each engine's server up alone, through every trace "
                   "(the default runs pacer's two servers side by side, taking each trace in turn)")
    p.add_argument("--isa", default="native", choices=["native", "avx2"],
                   help="avx2: this script and every server held to their AVX2 paths (isa_switch.py)")
    args = p.parse_args()
    isa_switch.apply()
    rates = [float(r) for r in args.rates.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="slo-overload-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"# slo_overload: {isa_switch.label()} (kernel ISA {kernel_isa()}), {os.cpu_count()} cores, "
          f"load {loadavg()}, work {work}")
    if not args.no_sim and not calibration_path().exists():
        print("# no cpu-local fit saved: running `pacer sim calibrate`")
        subprocess.run([str(BIN / "pacer"), "sim", "calibrate"], check=True, stdout=subprocess.DEVNULL)
    print(f"# {fit_line()}")
    # every run its own trace (a server's prefix cache would serve a repeated one): the highest
    # rate takes the given seeds, each lower rate seed + 10 x its distance from the top
    runs = [(r, seeds[0] + 10 * (len(rates) - 1 - i)) for i, r in enumerate(rates[:-1])]
    runs += [(rates[-1], s) for s in seeds]
    results = measure(args, runs, work)
    for rate, seed in runs:
        print(f"\n## rate {rate} req/s, seed {seed}, {args.num_prompts} prompts, load {loadavg()}")
        print(HEADER)
        for name, *_ in engines(args, 0):
            for rep in range(args.repeats):
                print(row(name if args.repeats == 1 else f"{name} #{rep + 1}", results[name, rate, seed][rep]))
            if not args.no_sim and name.startswith("pacer"):
                policy = name.split()[1]
                sim = simulate(policy, rate, seed, args.num_prompts, work / f"sim-{policy}-r{rate}-s{seed}.json",
                               args.sim_step_noise)
                print(row(f"  sim {policy}", sim))
    if {"pacer fcfs", "pacer slo"} <= {name for name, *_ in engines(args, 0)}:
        for rate in rates:   # past saturation the first five bars, at a load the machine serves attainment's
            verdicts(results, rate, [s for r, s in runs if r == rate], bool(args.vllm))
            if args.step_log:
                work_lines(results, rate, [s for r, s in runs if r == rate])
    # each engine's medians over the repeats, per rate and seed (for cpu_verdicts.py)
    print("RESULT " + json.dumps({f"{name}|{rate}|{seed}": median_summary(runs)["overall"]
                                  for (name, rate, seed), runs in results.items()}))
    return 0


def measure(args: argparse.Namespace, runs: list[tuple[float, int]], work: Path
            ) -> dict[tuple[str, float, int], list[dict[str, Any]]]:
    """Every engine's summary of every run, one per repeat; each repeat starts each server anew, the
    engines in turn (`_order`), so a machine that speeds up or slows down over the run does not
    favour whoever goes first. pacer's servers (unless `--serial`) are up together, started and
    warmed one after the other, and take each trace back to back, first one then the other
    (`_turns`): the two runs a throughput ratio compares are seconds apart, not a server's whole
    set of traces apart (this machine's slow spells last about a minute)."""
    results: dict[tuple[str, float, int], list[dict[str, Any]]] = {}
    fit = fit_model() if args.step_log else None
    for rep in range(args.repeats):
        for group in _groups(_order(engines(args, 0), rep), together=not args.serial):
            with contextlib.ExitStack() as stack:
                live = []
                for name, cmd, env in group:
                    port = _free_port()   # the previous server of the group is up: its port is taken
                    tag = name.replace(" ", "-") + (f"-{rep + 1}" if args.repeats > 1 else "")
                    steps = work / f"{tag}-steps.jsonl" if fit is not None and name.startswith("pacer") else None
                    cmd = _on_port(cmd, port) + (["--step-log", str(steps)] if steps else [])
                    url = stack.enter_context(server(cmd, port, work / f"{tag}.log", env))
                    tokenizer = args.vllm_model if name.startswith("vllm") else None
                    # warm-up, discarded: the first requests pay kernel builds, allocations and calibration
                    bench(url, 4.0, 99, 6, work / f"{tag}-warmup.json", tokenizer)
                    live.append(_Live(name, tag, url, tokenizer, steps, len(read_step_log(steps)) if steps else 0))
                for i, (rate, seed) in enumerate(runs):
                    for e in _turns(live, i):
                        summary = bench(e.url, rate, seed, args.num_prompts, work / f"{e.tag}-r{rate}-s{seed}.json",
                                        e.tokenizer)
                        if e.steps and fit is not None:
                            rows = read_step_log(e.steps, skip_lines=e.seen)   # each step written as it ended
                            e.seen += len(rows)
                            summary["steps"] = {"num": len(rows), "busy_s": sum(r["measured_s"] for r in rows),
                                                "fit_s": priced_work_s(rows, fit)}
                        results.setdefault((e.name, rate, seed), []).append(summary)
                        print(f"# {e.name} rate {rate} seed {seed} repeat {rep + 1} done, load {loadavg()}", flush=True)
    return results


@dataclasses.dataclass
class _Live:
    """A server of the repeat, up: its name, file tag, URL, tokenizer, step log and lines seen."""

    name: str
    tag: str
    url: str
    tokenizer: str | None
    steps: Path | None
    seen: int


def _on_port(cmd: list[str], port: int) -> list[str]:
    """`cmd` with its `--port` value replaced."""
    i = cmd.index("--port") + 1
    return [*cmd[:i], str(port), *cmd[i + 1:]]


def _groups(order: list[tuple[str, list[str], dict[str, str]]], together: bool
            ) -> list[list[tuple[str, list[str], dict[str, str]]]]:
    """The servers up at once, in turn: pacer's side by side as one group (`together`), every
    other engine alone (vLLM beside pacer would share the two cores with an idle engine of its own)."""
    out: list[list[tuple[str, list[str], dict[str, str]]]] = []
    for e in order:
        if together and e[0].startswith("pacer") and out and out[-1][0][0].startswith("pacer"):
            out[-1].append(e)
        else:
            out.append([e])
    return out


def _turns(live: list[_Live], i: int) -> list[_Live]:
    """Who runs trace `i`: the group's servers in order, reversed every other trace, so neither
    runs each trace first."""
    return live if i % 2 == 0 else live[::-1]


def fit_line() -> str:
    """Which fit the slo servers predict with and the simulator runs on, and how well it fitted:
    a fit made while the machine was busy misprices some step shapes against others (the
    morning's `--quick` fit priced a 2,040-token chunk 25% above a 30-token one, relative to
    what they took), and the policy's choices between short and long steps follow the prices."""
    path = calibration_path()
    if not path.exists():
        return "fit: none saved (the servers predict with pacer's shipped cpu-local fit)"
    calib = get_hardware("cpu-local").calibration or {}
    fit = calib.get("fit", {})
    planned = "" if fit_is_trusted(calib) else "; not trusted: the slo servers plan with the shipped fit"
    return (f"fit: {path}, made {calib.get('created', '?')}{' (--quick)' if calib.get('quick') else ''}, "
            f"{fit.get('samples', '?')} steps, error median {100 * fit.get('median_rel_err', float('nan')):.1f}% "
            f"p90 {100 * fit.get('p90_rel_err', float('nan')):.1f}%{planned}")


def fit_model() -> CostModel:
    """This machine's `pacer sim calibrate` fit of the default model (the roofline without one)."""
    return make_cost_model(get_hardware("cpu-local"), get_model(None), "float32")


def work_lines(results: dict[tuple[str, float, int], list[dict[str, Any]]], rate: float, seeds: list[int]) -> None:
    """Per seed, the work each policy's steps did priced by the fit (slo / fcfs: the policy's own
    cost), and the machine's speed in each run (busy time measured / priced), repeat by repeat."""
    print(f"\n## {rate} req/s: the steps priced by this machine's fit [by repeat]")
    for seed in seeds:
        f, s = results["pacer fcfs", rate, seed], results["pacer slo", rate, seed]
        fw = [r["steps"]["fit_s"] for r in f]
        sw = [r["steps"]["fit_s"] for r in s]
        ratios = ", ".join(f"{b / a:.3f}" for a, b in zip(fw, sw, strict=True))
        speed = ", ".join(f"{a['steps']['busy_s'] / a['steps']['fit_s']:.2f}/{b['steps']['busy_s'] / b['steps']['fit_s']:.2f}"
                          for a, b in zip(f, s, strict=True))
        print(f"seed {seed}: work slo {statistics.median(sw):.1f}s vs fcfs {statistics.median(fw):.1f}s of the fit "
              f"({statistics.median(sw) / statistics.median(fw):.3f}x) [{ratios}]; steps "
              f"{statistics.median(r['steps']['num'] for r in s):.0f} vs {statistics.median(r['steps']['num'] for r in f):.0f}; "
              f"measured / fit, fcfs/slo [{speed}]")


def _order(engines: list[tuple[str, list[str], dict[str, str]]], rep: int
           ) -> list[tuple[str, list[str], dict[str, str]]]:
    """The engines of repeat `rep`: pacer's side by side, in reverse every other repeat (fcfs, slo
    then slo, fcfs); the others (vLLM) after them for two repeats, then before them for two. Over
    three repeats slo runs second, first, then third; reversing the whole list instead kept it in
    the middle, after another server's teardown, every time."""
    pacer = [e for e in engines if e[0].startswith("pacer")]
    others = [e for e in engines if not e[0].startswith("pacer")]
    if rep % 2:
        pacer = pacer[::-1]
    return others + pacer if (rep // 2) % 2 else pacer + others


def median_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the repeats (a figure some repeat lacks: over the others)."""
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = {}
    for key in {k for r in runs for k in r}:
        vals = [r[key] for r in runs if key in r and r[key] is not None]
        if vals and isinstance(vals[0], dict):
            out[key] = median_summary(vals)
        elif vals and all(isinstance(v, (int, float)) for v in vals):
            out[key] = statistics.median(vals)
        else:
            out[key] = vals[0] if vals else None
    return out


def checks(f: dict[str, Any], s: dict[str, Any], v: dict[str, Any] | None) -> dict[str, tuple[str, bool]]:
    """The issue's verdicts on one pair of summaries (fcfs, slo; and vLLM's): name -> (text, met)."""
    fo, so = f["overall"], s["overall"]
    tput = so["output_tok_s"] / fo["output_tok_s"] if fo["output_tok_s"] else float("nan")
    out = {"tput": (f"throughput {tput:.2f}x fcfs (>= 0.95: ", tput >= 0.95),
           "good": (f"goodput {so['goodput_req_s']:.3f} vs fcfs {fo['goodput_req_s']:.3f} (",
                    so["goodput_req_s"] >= fo["goodput_req_s"])}
    if v is not None:
        vo = v["overall"]
        out["vllm"] = (f"vs vllm {vo['goodput_req_s']:.3f} (", so["goodput_req_s"] >= vo["goodput_req_s"])
    fc, sc = f.get("chat", {}), s.get("chat", {})
    if fc.get("ttft_p50") and sc.get("ttft_p50") is not None:
        out["chat"] = (f"chat ttft p50 {sc['ttft_p50']:.2f}s vs {fc['ttft_p50']:.2f}s (",
                       sc["ttft_p50"] <= 1.1 * fc["ttft_p50"])
    fa, sa = fo["slo_attainment"], so["slo_attainment"]   # the bar at a load the machine can serve
    out["att"] = (f"attainment {sa:.2f} vs fcfs {fa:.2f} (+0.2 or both >= 0.9: ", sa >= fa + 0.2 or min(sa, fa) >= 0.9)
    if fc.get("itl_p99") and sc.get("itl_p99") is not None:   # chat's: the class an ITL target binds
        pooled = (f" [all classes {so['itl_p99'] * 1e3:.0f} vs {fo['itl_p99'] * 1e3:.0f}]"
                  if fo.get("itl_p99") and so.get("itl_p99") is not None else "")
        out["itl"] = (f"chat itl p99 {sc['itl_p99'] * 1e3:.0f} vs {fc['itl_p99'] * 1e3:.0f} ms{pooled} (",
                      sc["itl_p99"] < fc["itl_p99"])
    return out


def verdicts(results: dict[tuple[str, float, int], list[dict[str, Any]]], rate: float, seeds: list[int],
             vllm: bool) -> None:
    repeats = len(results["pacer fcfs", rate, seeds[0]])
    print(f"\n## {rate} req/s: slo vs fcfs" + (" and vllm" if vllm else "")
          + (f", medians of {repeats} repeats [single repeats that agree]" if repeats > 1 else ""))
    for seed in seeds:
        runs = {name: results[name, rate, seed] for name in ("pacer fcfs", "pacer slo", "vllm serve") if vllm or
                name != "vllm serve"}
        med = checks(*(median_summary(runs[n]) for n in ("pacer fcfs", "pacer slo")),
                     median_summary(runs["vllm serve"]) if vllm else None)
        singles = [checks(runs["pacer fcfs"][i], runs["pacer slo"][i], runs["vllm serve"][i] if vllm else None)
                   for i in range(repeats)]
        ratios = [s["overall"]["output_tok_s"] / f["overall"]["output_tok_s"]
                  for f, s in zip(runs["pacer fcfs"], runs["pacer slo"], strict=True)]
        # the verdict is the ratio of the medians; the pairs' own median beside it (pacer's two
        # servers take each trace seconds apart unless --serial: a pair shares the machine's speed)
        paired = ", ".join(f"{r:.2f}" for r in ratios) + (f"; their median {statistics.median(ratios):.2f}"
                                                         if repeats > 1 else "")
        line = []
        for key, (text, ok) in med.items():
            agree = sum(1 for one in singles if key in one and one[key][1] == ok)
            line.append(f"{text}{'yes' if ok else 'NO'})" + (f" [{agree}/{repeats}]" if repeats > 1 else "")
                        + (f" [by repeat {paired}]" if repeats > 1 and key == "tput" else ""))
        print(f"seed {seed}: " + "; ".join(line))


if __name__ == "__main__":
    sys.exit(main())
