"""Offline throughput, side by side on the same weights and threads, in one run.

  python benchmarks/offline_throughput.py [--quick] [--skip-hf] [--skip-vllm] [--dtypes float32,bfloat16]
                                         [--repeats 3]

Prints, for workload W (../shared/peers/workload_w.json: 32 x 256-token prompts, 64 outputs)
output tokens/s of pacer, HF transformers `generate` (one static batch) and vLLM-for-CPU (in
its own venv as a subprocess, when ../shared/peers/setup.sh has built it under $PEERS_DIR),
and pacer's ratios; then a varied-length workload (64 requests, prompts uniform 32..1024,
outputs uniform 16..256, greedy, ignore_eos) against HF static batching; batch-1 decode
ms/token beside vLLM's (measured in this run by vllm_batch1.py, and the peers README's
figure) and the memory-bandwidth floor; and pacer's per-step time split with
64 running requests. Every request generates exactly its output length.

Symmetric by construction: every engine runs each timed workload `--repeats` times after an
untimed warm-up and reports the median (the same statistic for all; the runs are printed),
and batch-1 decode is timed the same way for pacer and vLLM: (t(1 + N tokens) - t(1 token)) / N
on one 32-token prompt, each time the median of `--repeats` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

import torch

from pacer import LLM, SamplingParams
from pacer.model.hf_reference import hf_llama_from_checkpoint
from pacer.model.loader import load_checkpoint

HERE = pathlib.Path(__file__).resolve().parent
PEERS = (HERE.parent.parent / "shared" / "peers") if (HERE.parent.parent / "shared").is_dir() else None
PEERS_DIR = pathlib.Path(os.environ.get("PEERS_DIR", "/tmp/pacer-peers"))
VLLM_REFERENCE = {"float32": (134.7, 32.8), "bfloat16": (241.3, 22.2)}   # tok/s, batch-1 ms (peers/README)
FLOOR_MS = {"float32": 9.0, "bfloat16": 5.0}


def line(msg: str) -> None:
    print(msg, flush=True)


def load_w(quick: bool) -> tuple[list[list[int]], list[int]]:
    path = (PEERS / "workload_w.json") if PEERS else None
    if path and path.is_file():
        w = json.loads(path.read_text())
        prompts, outs = w["prompts"], w.get("output_lens") or [w["output_len"]] * len(w["prompts"])
    else:  # same shape, generated
        rng = random.Random(1234)
        prompts = [[rng.randrange(100, 49000) for _ in range(256)] for _ in range(32)]
        outs = [64] * 32
    if quick:
        prompts, outs = prompts[:8], outs[:8]
    return prompts, outs


def varied_workload(n: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 49000) for _ in range(rng.randint(32, 1024))] for _ in range(n)]
    outs = [rng.randint(16, 256) for _ in range(n)]
    return prompts, outs


def forced(outs: list[int]) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0) for n in outs]


def stat(runs_s: list[float]) -> float:
    """The one statistic every engine's repeated timings are reduced with."""
    return statistics.median(runs_s)


def runs_text(runs_s: list[float]) -> str:
    return "/".join(f"{t:.2f}" for t in runs_s) + " s"


def run_pacer(llm: LLM, prompts: list[list[int]], outs: list[int], repeats: int) -> tuple[float, list[float]]:
    llm.generate([list(range(100, 164))], SamplingParams(max_tokens=4, temperature=0))   # warm-up
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        res = llm.generate(prompts, forced(outs))
        runs.append(time.perf_counter() - t)
        assert [len(o.token_ids) for o in res] == outs
    return sum(outs) / stat(runs), runs


def hf_model(dtype: torch.dtype) -> torch.nn.Module:
    return hf_llama_from_checkpoint(load_checkpoint(None), dtype)


def run_hf_static(model: torch.nn.Module, prompts: list[list[int]], outs: list[int],
                  repeats: int) -> tuple[float, list[float]]:
    """One static batch, left-padded; runs until the longest output; counts only wanted tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    n = max(outs)
    with torch.inference_mode():
        model.generate(ids[:1, -16:], attention_mask=mask[:1, -16:], max_new_tokens=2, do_sample=False, pad_token_id=0)
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0)
            runs.append(time.perf_counter() - t)
    return sum(outs) / stat(runs), runs


def _vllm(script: pathlib.Path, dtype: str, *extra: str) -> dict | None:
    """Run `script` in vLLM's venv on the HF copy of the weights; its RESULT line as a dict."""
    py = PEERS_DIR / "vllm-venv" / "bin" / "python"
    model = PEERS_DIR / "smollm2-hf"
    if not (py.is_file() and (model / "config.json").is_file() and PEERS):
        line(f"  vLLM {dtype}: skipped (build it with: PEERS_DIR={PEERS_DIR} bash ../shared/peers/setup.sh)")
        return None
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{torch.get_num_threads() - 1}")  # same threads as pacer
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    cmd = [str(py), str(script), "--model", str(model), "--dtype", dtype, *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    for out_line in proc.stdout.splitlines():
        if out_line.startswith("RESULT "):
            return dict(json.loads(out_line[len("RESULT "):]))
    line(f"  vLLM {dtype}: failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return None


def run_vllm(dtype: str, quick: bool, repeats: int) -> tuple[float, list[float]] | None:
    workload = PEERS / "workload_w.json"
    if quick:
        w = json.loads(workload.read_text())
        w["prompts"] = w["prompts"][:8]
        workload = pathlib.Path("/tmp/pacer_w_quick.json")
        workload.write_text(json.dumps(w))
    res = _vllm(PEERS / "vllm_offline.py", dtype, "--workload", str(workload), "--repeats", str(repeats))
    if res is None:
        return None
    runs = [float(t) for t in res["runs_s"]]   # its own output_tok_s is the best run: use the median
    return float(res["output_tokens"]) / stat(runs), runs


def batch1_ms(runs_one: list[float], runs_many: list[float], n: int) -> float:
    """Decode ms/token from timings of 1 and of 1 + n generated tokens (the prefill cancels)."""
    return 1000 * (stat(runs_many) - stat(runs_one)) / n


def run_vllm_batch1(dtype: str, repeats: int, n: int) -> float | None:
    res = _vllm(pathlib.Path(__file__).with_name("vllm_batch1.py"), dtype, "--repeats", str(repeats),
                "--tokens", str(n))
    return None if res is None else batch1_ms(res["runs_one_s"], res["runs_many_s"], n)


def batch1_decode_ms(llm: LLM, repeats: int, n: int) -> float:
    """The same method as vllm_batch1.py: one 32-token prompt, 1 token vs 1 + n tokens."""
    prompt = [list(range(200, 232))]
    llm.generate(prompt, forced([4]))   # warm-up

    def times(k: int) -> list[float]:
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = llm.generate(prompt, forced([k]))
            runs.append(time.perf_counter() - t)
            assert len(out[0].token_ids) == k
        return runs

    return batch1_ms(times(1), times(1 + n), n)


def step_split(llm: LLM, n_req: int = 64) -> str:
    prompts = [[(i * 131 + j) % 40000 + 100 for j in range(128)] for i in range(n_req)]
    llm.engine.step_stats.clear()
    llm.generate(prompts, forced([48] * n_req))
    steps = [s for s in llm.engine.step_stats if s.num_running == n_req and s.num_prefill_tokens == 0]
    tot = {k: sum(getattr(s, k) for s in steps) for k in ("schedule_s", "prepare_s", "forward_s", "sample_s", "update_s")}
    total = sum(tot.values())
    per = {k: 1000 * v / len(steps) for k, v in tot.items()}
    book = (tot["schedule_s"] + tot["update_s"]) / total
    book_prep = (tot["schedule_s"] + tot["update_s"] + tot["prepare_s"]) / total
    return (f"{len(steps)} decode steps with {n_req} running: per step schedule {per['schedule_s']:.2f} ms, "
            f"prepare {per['prepare_s']:.2f} ms, forward {per['forward_s']:.2f} ms, sample {per['sample_s']:.2f} ms, "
            f"update {per['update_s']:.2f} ms; schedule+update = {100 * book:.1f}% of step time "
            f"(with input preparation {100 * book_prep:.1f}%)")


def w_line(dtype: str, r: dict[str, tuple[float, list[float]] | None], repeats: int) -> str:
    pacer, pacer_runs = r["pacer"] or (0.0, [])
    parts = [f"pacer {pacer:.1f} ({runs_text(pacer_runs)})"]
    if r.get("hf"):
        hf, hf_runs = r["hf"] or (0.0, [])
        parts.append(f"HF static {hf:.1f} ({runs_text(hf_runs)}; pacer/HF {pacer / hf:.2f}x)")
    if r.get("vllm"):
        vllm, vllm_runs = r["vllm"] or (0.0, [])
        parts.append(f"vLLM {vllm:.1f} ({runs_text(vllm_runs)}; pacer/vLLM {pacer / vllm:.2f}x)")
    elif dtype in VLLM_REFERENCE:
        parts.append(f"vLLM (peers/README, not this run) {VLLM_REFERENCE[dtype][0]:.1f}")
    return f"[W {dtype}] output tok/s, median of {repeats}: " + " | ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--quick", action="store_true", help="small workloads (smoke run)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per engine and workload (median reported)")
    ap.add_argument("--batch1-tokens", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtypes, reps = args.dtypes.split(","), args.repeats
    line(f"# pacer offline throughput, torch {torch.__version__}, {torch.get_num_threads()} threads, "
         f"{reps} timed runs per engine (median), load average {os.getloadavg()[0]:.1f}")
    w_prompts, w_outs = load_w(args.quick)
    b1: dict[str, float] = {}
    vllm_b1: dict[str, float | None] = {}
    for dtype in dtypes:
        llm = LLM(dtype=dtype, max_num_seqs=256, max_num_batched_tokens=args.max_num_batched_tokens,
                  enable_prefix_caching=False, kv_cache_memory="2GiB")
        r: dict[str, tuple[float, list[float]] | None] = {"pacer": run_pacer(llm, w_prompts, w_outs, reps)}
        b1[dtype] = batch1_decode_ms(llm, reps, args.batch1_tokens)
        if dtype == "float32":
            line("[step split] " + step_split(llm, 16 if args.quick else 64))
        del llm
        if not args.skip_hf and dtype == "float32":
            r["hf"] = run_hf_static(hf_model(torch.float32), w_prompts, w_outs, reps)
        if not args.skip_vllm:
            r["vllm"] = run_vllm(dtype, args.quick, reps)
            vllm_b1[dtype] = run_vllm_batch1(dtype, reps, args.batch1_tokens)
        line(w_line(dtype, r, reps))
    for dtype in dtypes:
        ref = VLLM_REFERENCE.get(dtype, (None, None))[1]
        measured = vllm_b1.get(dtype)
        vllm = (f"vLLM {measured:.1f} ms (vLLM/pacer {measured / b1[dtype]:.2f}x) | vLLM (peers/README) {ref} ms"
                if measured else f"vLLM (peers/README, not this run) {ref} ms")
        line(f"[batch-1 decode {dtype}] (t(1+{args.batch1_tokens}) - t(1)) / {args.batch1_tokens}, medians of "
             f"{reps}: pacer {b1[dtype]:.1f} ms/token | {vllm} | memory-bandwidth floor ~{FLOOR_MS.get(dtype)} ms")
    n_var = 16 if args.quick else 64
    v_prompts, v_outs = varied_workload(n_var)
    llm = LLM(dtype="float32", max_num_seqs=256, max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=False, kv_cache_memory="4GiB")
    pv, pv_runs = run_pacer(llm, v_prompts, v_outs, reps)
    del llm
    msg = (f"[varied {n_var} req, prompts 32..1024, outputs 16..256, float32] output tok/s, median of {reps}: "
           f"pacer {pv:.1f} ({runs_text(pv_runs)})")
    if not args.skip_hf:
        hv, hv_runs = run_hf_static(hf_model(torch.float32), v_prompts, v_outs, reps)
        msg += f" | HF static batch {hv:.1f} ({runs_text(hv_runs)}) | pacer/HF {pv / hv:.2f}x"
    line(msg)
    line(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
