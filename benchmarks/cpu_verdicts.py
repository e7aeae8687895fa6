"""Issue 26's bars on the CPU at hand, every engine in one run: one command, one verdict table.

  python benchmarks/cpu_verdicts.py [--isa native|avx2] [--quick] [--skip-online] [--repeats 3]

Runs four benchmarks, each its own process under the same `--isa` and PEERS_DIR (the peers of
../shared/peers/setup.sh; on an AVX-512 machine standing in for an AVX2-only CPU, point PEERS_DIR
at a llama.cpp built for AVX2), streams their output, and reads the RESULT line each prints:

1. `offline_throughput.py --dtypes float32 --weights none,gguf+int8 --skip-hf`: workload W and
   the varied-length workload, pacer float32 against vLLM-CPU float32; batch-1 decode of the
   shipped Q4_1 GGUF as pacer runs it by default (packed, int8 activations) against llama.cpp
   on the same file;
2. `quantized.py`: 32-sequence decode and a 256-token prefill of the packed weights with int8
   activations against float32; quality against float32 on held-out chats of Q4_1 computed
   from its blocks (`q-float`) and with int8 activations (`q-int8`);
3. `slo_overload.py --policies fcfs --rates 0.3 --seeds 1 --no-sim`: online, `pacer bench
   --workload mixed` against `pacer serve --quantization none` and `vllm serve --dtype float32`
   (float32 both: the same weights), the same trace;
4. `sim_speed.py`: 10,000 simulated requests on H200 x8.

Then one line per bar: met / NOT met / not measured, its figure, the bar, under the CPU flags
and the load average. `--quick` runs small workloads (a smoke run; its lines say so and are
not the issue's workloads). About 27 minutes on a 2-core machine without `--quick`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import isa_switch
from slo_common import loadavg

HERE = Path(__file__).resolve().parent
Results = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One of the issue's bars: its figure as measured, the bar, and whether it holds (None: not measured)."""

    item: str
    figure: str
    bar: str
    met: bool | None

    def line(self) -> str:
        state = {True: "met", False: "NOT met", None: "not measured"}[self.met]
        return f"{state:<13} {self.item:<66} {self.figure:<36} bar {self.bar}"


def _ratio(item: str, num: float | None, den: float | None, bar: float, unit: str = "x") -> Verdict:
    if not num or not den:
        return Verdict(item, "-", f">= {bar:.2f}{unit}", None)
    r = num / den
    return Verdict(item, f"{r:.2f}{unit} ({num:.1f} / {den:.1f})", f">= {bar:.2f}{unit}", r >= bar)


def verdicts(res: Results, quick: bool = False) -> list[Verdict]:
    """The issue's bars judged on the benchmarks' RESULT dicts (`offline`, `quantized`, `online`,
    `sim`; a missing one, or a missing figure, is "not measured")."""
    tag = " (quick)" if quick else ""
    off = res.get("offline") or {}
    w, varied, b1 = off.get("w", {}).get("float32", {}), off.get("varied", {}).get("float32", {}), off.get("batch1_ms", {})
    out = [_ratio(f"float32 on W, pacer / vLLM-CPU{tag}", w.get("pacer"), w.get("vllm"), 1.0),
           _ratio(f"float32 on the varied workload, pacer / vLLM-CPU{tag}", varied.get("pacer"), varied.get("vllm"), 1.0)]
    online = res.get("online") or {}
    pacer_on = next((v for k, v in online.items() if k.startswith("pacer fcfs|")), {})
    vllm_on = next((v for k, v in online.items() if k.startswith("vllm serve|")), {})
    out.append(_ratio(f"online float32 output tok/s, pacer serve / vllm serve{tag}", pacer_on.get("output_tok_s"),
                      vllm_on.get("output_tok_s"), 1.0))
    ours, theirs = b1.get("float32 pacer-gguf+int8"), b1.get("llama.cpp Q4_1")
    out.append(Verdict(f"batch-1 decode of the shipped Q4_1, pacer vs llama.cpp{tag}",
                       f"{ours:.1f} vs {theirs:.1f} ms/token" if ours and theirs else "-",
                       "pacer <= llama.cpp", None if not (ours and theirs) else ours <= theirs))
    q = res.get("quantized") or {}
    speed, quality = q.get("speed", {}), q.get("quality", {})
    int8, f32 = speed.get("q-int8") or {}, speed.get("float32") or {}
    out.append(_ratio(f"32-sequence decode, Q4_1 + int8 activations / float32{tag}", int8.get("b32_tok_s"),
                      f32.get("b32_tok_s"), 1.5))
    out.append(_ratio(f"256-token prefill, int8 activations / float32{tag}", int8.get("prefill_tok_s"),
                      f32.get("prefill_tok_s"), 1.3))
    out.append(_quality("Q4_1 from its blocks vs float32", quality.get("q-float"), "kl_max", 1e-3, None, tag))
    out.append(_quality("int8 activations vs float32", quality.get("q-int8"), "kl_mean", 1e-2, 0.95, tag))
    sim = res.get("sim") or {}
    wall = sim.get("wall_s")
    out.append(Verdict(f"pacer sim, {sim.get('requests', 10_000):,} requests on H200x8",
                       "-" if wall is None else f"{wall:.2f} s wall", "< 10 s (10,000 requests)",
                       None if wall is None or sim.get("requests") != 10_000 else wall < 10.0))
    return out


def _quality(what: str, q: dict[str, Any] | None, kl_key: str, kl_bar: float, agree_bar: float | None,
             tag: str) -> Verdict:
    """A quality bar: KL (max or mean per token) at most `kl_bar`; greedy agreement at least
    `agree_bar`, or (None) every greedy token equal apart from counted near-ties. Judged over 64
    tokens a chat, the issue's length; fewer are shown and not judged."""
    kl_name = "per-token KL" if kl_key == "kl_max" else "mean KL"
    bar = f"{kl_name} <= {kl_bar:g}, " + (f"agreement >= {agree_bar:.0%}" if agree_bar else "greedy equal but near-ties")
    if not q:
        return Verdict(what + tag, "-", bar, None)
    figure = f"KL max {q['kl_max']:.1e} mean {q['kl_mean']:.1e}, agree {q['agreement']:.1%} ({q['near_ties']} ties)"
    ok = q[kl_key] <= kl_bar and (q["agreement"] >= agree_bar if agree_bar else q["other"] == 0)
    return Verdict(f"{what}, {q['tokens']} tokens a chat{tag}", figure, bar, ok if q["tokens"] >= 64 else None)


def run(script: str, *args: str) -> Results | None:
    """One benchmark as a child process, its output streamed (indented); its RESULT line as a dict."""
    cmd = [sys.executable, str(HERE / script), *args]
    print(f"\n## {script} {' '.join(args)}  (load {loadavg()}, {time.strftime('%H:%M:%S UTC', time.gmtime())})",
          flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    result = None
    assert proc.stdout is not None
    for out_line in proc.stdout:
        if out_line.startswith("RESULT "):
            result = json.loads(out_line[len("RESULT "):])
        else:
            print("  " + out_line, end="", flush=True)
    if (rc := proc.wait()) != 0:
        print(f"  ({script} exited with {rc}: its bars are not measured)")
        return None
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isa", default="native", choices=["native", "avx2"],
                    help="avx2: every benchmark held to its AVX2 paths (an AVX2-only CPU's stand-in; isa_switch.py)")
    ap.add_argument("--quick", action="store_true", help="small workloads: a smoke run, not the issue's figures")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per engine and workload (medians)")
    ap.add_argument("--skip-online", action="store_true", help="no servers (the online bar is not measured)")
    args = ap.parse_args()
    isa_switch.apply()
    from pacer.model.kernels import kernel_isa
    peers = Path(os.environ.get("PEERS_DIR", "/tmp/pacer-peers"))
    head = f"{isa_switch.label()} (kernel ISA {kernel_isa()}), {os.cpu_count()} cores, PEERS_DIR {peers}"
    print(f"# cpu_verdicts: {head}, load {loadavg()}", flush=True)
    isa, reps = ["--isa", args.isa], ["--repeats", str(args.repeats)]
    res: Results = {
        "offline": run("offline_throughput.py", *isa, *reps, "--dtypes", "float32", "--weights", "none,gguf+int8",
                       "--skip-hf", *(["--quick"] if args.quick else [])),
        "quantized": run("quantized.py", *isa, *(["--repeats", "3", "--tokens", "16"] if args.quick else [])),
        "sim": run("sim_speed.py"),
    }
    vllm = peers / "vllm-venv"
    if not args.skip_online and (vllm / "bin" / "python").is_file():
        res["online"] = run("slo_overload.py", *isa, "--policies", "fcfs", "--rates", "0.3", "--seeds", "1",
                            "--no-sim", "--num-prompts", "6" if args.quick else "16", "--vllm", str(vllm),
                            "--vllm-model", str(peers / "smollm2-hf"), "--vllm-args",
                            "--max-model-len 4096 --dtype float32", "--pacer-args", "--quantization none")
    print(f"\n## issue 26's bars: {head}, load {loadavg()}" + (" (quick: not the issue's workloads)" if args.quick
                                                                  else ""))
    for v in verdicts(res, args.quick):
        print(v.line())
    if simd := (res["offline"] or {}).get("llamacpp_simd"):
        print(f"(llama.cpp built for: {simd})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
