"""Offline throughput, side by side on the same weights and threads, in one run.

  python benchmarks/offline_throughput.py [--quick] [--skip-hf] [--skip-vllm] [--dtypes float32,bfloat16]

Prints, for workload W (../shared/peers/workload_w.json: 32 x 256-token prompts, 64 outputs)
output tokens/s of pacer, HF transformers `generate` (one static batch) and vLLM-for-CPU (in
its own venv as a subprocess, when ../shared/peers/setup.sh has built it under $PEERS_DIR),
and pacer's ratios; then a varied-length workload (64 requests, prompts uniform 32..1024,
outputs uniform 16..256, greedy, ignore_eos) against HF static batching; batch-1 decode
ms/token beside vLLM's (measured in this run by vllm_batch1.py, and the peers README's
figure) and the memory-bandwidth floor; and pacer's per-step time split with
64 running requests. Every request generates exactly its output length.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
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


def run_pacer(llm: LLM, prompts: list[list[int]], outs: list[int]) -> float:
    llm.generate([list(range(100, 164))], SamplingParams(max_tokens=4, temperature=0))   # warm-up
    llm.engine.step_stats.clear()
    t = time.perf_counter()
    res = llm.generate(prompts, forced(outs))
    elapsed = time.perf_counter() - t
    assert [len(o.token_ids) for o in res] == outs
    return sum(outs) / elapsed


def hf_model(dtype: torch.dtype) -> torch.nn.Module:
    return hf_llama_from_checkpoint(load_checkpoint(None), dtype)


def run_hf_static(model: torch.nn.Module, prompts: list[list[int]], outs: list[int]) -> float:
    """One static batch, left-padded; runs until the longest output; counts only wanted tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    n = max(outs)
    with torch.inference_mode():
        model.generate(ids[:1, -16:], attention_mask=mask[:1, -16:], max_new_tokens=2, do_sample=False, pad_token_id=0)
        t = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        elapsed = time.perf_counter() - t
    return sum(outs) / elapsed


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


def run_vllm(dtype: str, quick: bool) -> float | None:
    workload = PEERS / "workload_w.json"
    if quick:
        w = json.loads(workload.read_text())
        w["prompts"] = w["prompts"][:8]
        workload = pathlib.Path("/tmp/pacer_w_quick.json")
        workload.write_text(json.dumps(w))
    res = _vllm(PEERS / "vllm_offline.py", dtype, "--workload", str(workload))
    return None if res is None else float(res["output_tok_s"])


def run_vllm_batch1(dtype: str) -> float | None:
    res = _vllm(pathlib.Path(__file__).with_name("vllm_batch1.py"), dtype)
    return None if res is None else float(res["decode_ms_per_token"])


def batch1_decode_ms(llm: LLM, n: int = 128) -> float:
    out = llm.generate([list(range(200, 232))], forced([n]))[0]
    return out.metrics.tpot * 1000


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--quick", action="store_true", help="small workloads (smoke run)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtypes = args.dtypes.split(",")
    line(f"# pacer offline throughput, torch {torch.__version__}, {torch.get_num_threads()} threads")
    w_prompts, w_outs = load_w(args.quick)
    results: dict[str, dict[str, float | None]] = {}
    b1: dict[str, float] = {}
    vllm_b1: dict[str, float | None] = {}
    for dtype in dtypes:
        llm = LLM(dtype=dtype, max_num_seqs=256, max_num_batched_tokens=args.max_num_batched_tokens,
                  enable_prefix_caching=False, kv_cache_memory="2GiB")
        r: dict[str, float | None] = {"pacer": run_pacer(llm, w_prompts, w_outs)}
        b1[dtype] = batch1_decode_ms(llm)
        if dtype == "float32":
            line("[step split] " + step_split(llm, 16 if args.quick else 64))
        del llm
        if not args.skip_hf and dtype == "float32":
            r["hf"] = run_hf_static(hf_model(torch.float32), w_prompts, w_outs)
        if not args.skip_vllm:
            r["vllm"] = run_vllm(dtype, args.quick)
            vllm_b1[dtype] = run_vllm_batch1(dtype)
        results[dtype] = r
        parts = [f"pacer {r['pacer']:.1f}"]
        if r.get("hf"):
            parts.append(f"HF static {r['hf']:.1f} (pacer/HF {r['pacer'] / r['hf']:.2f}x)")
        if r.get("vllm"):
            parts.append(f"vLLM {r['vllm']:.1f} (pacer/vLLM {r['pacer'] / r['vllm']:.2f}x)")
        else:
            ref = VLLM_REFERENCE[dtype][0] if dtype in VLLM_REFERENCE else None
            if ref:
                parts.append(f"vLLM (peers/README, not this run) {ref:.1f}")
        line(f"[W {dtype}] output tok/s: " + " | ".join(parts))
    for dtype in dtypes:
        ref = VLLM_REFERENCE.get(dtype, (None, None))[1]
        measured = vllm_b1.get(dtype)
        vllm = (f"vLLM {measured:.1f} ms (vLLM/pacer {measured / b1[dtype]:.2f}x) | vLLM (peers/README) {ref} ms"
                if measured else f"vLLM (peers/README, not this run) {ref} ms")
        line(f"[batch-1 decode {dtype}] pacer {b1[dtype]:.1f} ms/token | {vllm} | "
             f"memory-bandwidth floor ~{FLOOR_MS.get(dtype)} ms")
    n_var = 16 if args.quick else 64
    v_prompts, v_outs = varied_workload(n_var)
    llm = LLM(dtype="float32", max_num_seqs=256, max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=False, kv_cache_memory="4GiB")
    pv = run_pacer(llm, v_prompts, v_outs)
    del llm
    msg = f"[varied {n_var} req, prompts 32..1024, outputs 16..256, float32] output tok/s: pacer {pv:.1f}"
    if not args.skip_hf:
        hv = run_hf_static(hf_model(torch.float32), v_prompts, v_outs)
        msg += f" | HF static batch {hv:.1f} | pacer/HF {pv / hv:.2f}x"
    line(msg)


if __name__ == "__main__":
    sys.exit(main())
