"""Where a step's time goes, op by op, at each ISA level this machine can run (issue 26, item 1).

Two workloads on the default model (float32): prefill-heavy (8 prompts of 512 tokens, one output
token each) and decode-heavy (32 sequences of 16-token prompts, 64 output tokens each). Each
(workload, ISA) runs in its own process: `avx512` is this CPU as it is; `avx2` forces the AVX2 path
everywhere it can be forced (pacer's kernels `PACER_KERNEL_ISA=avx2`, oneDNN `ONEDNN_MAX_CPU_ISA=
AVX2`, ATen `ATEN_CPU_CAPABILITY=avx2`), standing in for an AVX2-only CPU. Time is attributed by
wrapping the model's parts (the wrappers cost a few microseconds a call): linear projections,
the LM head, attention, rope + KV write, RMSNorm (+ residual), SiLU-and-mul, the sampler, the
rest of the forward (embedding, views), and what the engine step spends outside the executor
(Python: scheduling, bookkeeping, detokenization). Beside them, vLLM-CPU on the same workload
(`vllm_op_profile.py` in its venv, when ../shared/peers/setup.sh has built it: torch.profiler's
self time per op, put in the same parts; its torch.compile'd graph is a part of its own).

Run: PYTHONPATH=src python benchmarks/op_profile.py [--threads 1] [--skip-vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from pacer.model.kernels import isa_env

PARTS = ("linear", "lm_head", "attention", "rope+kv write", "norm", "silu_and_mul", "sampler", "compiled graph",
         "forward other", "engine python")
PEERS_DIR = os.environ.get("PEERS_DIR", "/tmp/pacer-peers")
WORKLOADS = {"prefill-heavy": (8, 512, 1), "decode-heavy": (32, 16, 64)}   # (requests, prompt, output)
ISAS = {"avx512": {}, "avx2": isa_env("avx2")}


def _timed(table: dict[str, float], part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            table[part] += time.perf_counter() - t
    return wrapper


def measure(workload: str, threads: int) -> dict[str, Any]:
    """One workload in this process: seconds per part, the step total, the kernel level."""
    from pacer import LLM
    from pacer.model import linear as linear_mod
    from pacer.model import llama as llama_mod
    from pacer.model import sampler as sampler_mod
    from pacer.request import SamplingParams

    n, prompt_len, out_len = WORKLOADS[workload]
    llm = LLM(num_threads=threads, enable_prefix_caching=False, quantization="none")   # the float32 path
    model = llm.engine.executor.model
    prompts = [[1000 + (i * 131 + j * 7) % 20000 for j in range(prompt_len)] for i in range(n)]
    params = SamplingParams(max_tokens=out_len, ignore_eos=True, temperature=0.0)
    llm.generate(prompts[:2], params)   # warm-up: allocations, oneDNN primitives
    table: dict[str, float] = defaultdict(float)
    lm_head = model.lm_head
    plain_call = linear_mod.Linear.__call__

    def linear_call(self: Any, x: Any) -> Any:
        t = time.perf_counter()
        try:
            return plain_call(self, x)
        finally:
            table["lm_head" if self is lm_head else "linear"] += time.perf_counter() - t
    linear_mod.Linear.__call__ = linear_call   # type: ignore[method-assign]
    llama_mod.paged_attention = _timed(table, "attention", llama_mod.paged_attention)
    for name, part in (("_qkv_rope_write", "rope+kv write"), ("_add_norm", "norm"), ("_act_mul", "silu_and_mul")):
        setattr(model, name, _timed(table, part, getattr(model, name)))
    sampler_mod.Sampler.sample = _timed(table, "sampler", sampler_mod.Sampler.sample)   # type: ignore[method-assign]
    forward = model.forward
    model.forward = _timed(table, "forward", forward)
    t = time.perf_counter()
    llm.generate(prompts, params)
    total = time.perf_counter() - t
    inner = sum(table[p] for p in ("linear", "lm_head", "attention", "rope+kv write", "norm", "silu_and_mul"))
    table["forward other"] = table.pop("forward") - inner
    table["engine python"] = max(0.0, total - sum(table[p] for p in PARTS if p != "engine python"))
    return {"parts": dict(table), "total": total, "kernel": getattr(model.kernel, "isa", "torch"),
            "tokens": n * (prompt_len + out_len)}


def measure_vllm(workload: str, threads: int) -> dict[str, Any] | None:
    """vLLM on the same workload (its venv, the HF copy of the weights), or None when not built."""
    py, model = os.path.join(PEERS_DIR, "vllm-venv/bin/python"), os.path.join(PEERS_DIR, "smollm2-hf")
    if not (os.path.isfile(py) and os.path.isfile(os.path.join(model, "config.json"))):
        return None
    n, prompt_len, out_len = WORKLOADS[workload]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads > 1 else "0",
           "VLLM_CPU_KVCACHE_SPACE": "2"}
    cmd = [py, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_op_profile.py"), "--model", model,
           "--requests", str(n), "--prompt", str(prompt_len), "--output", str(out_len), "--threads", str(threads)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    for out_line in proc.stdout.splitlines():
        if out_line.startswith("RESULT "):
            res = json.loads(out_line[len("RESULT "):])
            res["kernel"] = "vllm"
            return dict(res)
    print(f"  vLLM: failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-vllm", action="store_true", help="pacer's ISA levels only")
    ap.add_argument("--child", nargs=2, metavar=("WORKLOAD", "ISA"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], args.threads)))
        return
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    shown = ",".join(x for x in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if x in flags)
    load = "/".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"op_profile  cpu flags {shown}  threads {args.threads}  load {load}")
    for workload in WORKLOADS:
        results = {}
        for isa, env in ISAS.items():
            proc = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--child", workload, isa],
                                  env={**os.environ, **env}, capture_output=True, text=True, check=True)
            results[isa] = json.loads(proc.stdout.strip().splitlines()[-1])
        if not args.skip_vllm and (v := measure_vllm(workload, args.threads)) is not None:
            results["vllm"] = v
        n, p, o = WORKLOADS[workload]
        print(f"\n{workload}: {n} requests x {p} prompt tokens, {o} output tokens (kernels: "
              + ", ".join(f"{isa} -> {r['kernel']}" for isa, r in results.items()) + ")")
        print(f"{'part':<16}" + "".join(f"{isa + ' s':>12}{'share':>8}" for isa in results) + f"{'avx2/avx512':>13}"
              + (f"{'vllm/avx512':>13}" if "vllm" in results else ""))
        for part in PARTS:
            row = f"{part:<16}"
            for r in results.values():
                row += f"{r['parts'].get(part, 0.0):>12.3f}{r['parts'].get(part, 0.0) / r['total']:>8.1%}"
            a, b = results["avx512"]["parts"].get(part, 0.0), results["avx2"]["parts"].get(part, 0.0)
            row += f"{b / a:>12.2f}x" if a > 0 else f"{'':>13}"
            if "vllm" in results and a > 0 and (v := results["vllm"]["parts"].get(part, 0.0)) > 0:
                row += f"{v / a:>12.2f}x"
            print(row)
        row = f"{'total':<16}" + "".join(f"{r['total']:>12.3f}{1:>8.0%}" for r in results.values())
        row += f"{results['avx2']['total'] / results['avx512']['total']:>12.2f}x"
        if "vllm" in results:
            row += f"{results['vllm']['total'] / results['avx512']['total']:>12.2f}x"
            print(row + f"\nvLLM without the profiler: {results['vllm']['unprofiled']:.3f} s "
                  f"(vllm/avx512 {results['vllm']['unprofiled'] / results['avx512']['total']:.2f}x); its costliest ops: " + ", ".join(f"{k} {v:.3f} s" for k, v in results["vllm"]["ops"][:6]))
        else:
            print(row)
    print(f"\nload {'/'.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
