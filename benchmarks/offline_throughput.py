"""Offline throughput, side by side on the same weights and threads, in one run.

  python benchmarks/offline_throughput.py [--quick] [--skip-hf] [--skip-vllm] [--skip-llamacpp]
                                         [--dtypes float32,bfloat16] [--weights none,gguf] [--repeats 3]
                                         [--isa native|avx2] [--batch1-only]

Prints, for workload W (../shared/peers/workload_w.json: 32 x 256-token prompts, 64 outputs)
output tokens/s of pacer (per weight format: `none` = the GGUF dequantized to float32, `gguf` =
its Q4_1/Q8_0 blocks kept packed, float32 activations; `gguf+int8` = packed, int8 activations), HF transformers `generate` (one static
batch), vLLM-for-CPU and llama.cpp on the same GGUF (each in its own venv as a subprocess, when
../shared/peers/setup.sh has built it under $PEERS_DIR; llama.cpp through llama-cpp-python's
multi-sequence batching, llamacpp_peer.py), and pacer's ratios; then a varied-length workload (64 requests, prompts uniform 32..1024,
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
import tempfile
import time
from typing import Any

import isa_switch

isa_switch.apply()   # before torch is imported: `--isa avx2` holds every library to AVX2

import torch  # noqa: E402

from pacer import LLM, SamplingParams  # noqa: E402
from pacer.model.hf_reference import hf_llama_from_checkpoint  # noqa: E402
from pacer.model.loader import load_checkpoint  # noqa: E402

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


def w_file(quick: bool) -> pathlib.Path:
    """Workload W's JSON for the peers (its first 8 prompts with --quick)."""
    workload = PEERS / "workload_w.json"
    if quick:
        w = json.loads(workload.read_text())
        w["prompts"] = w["prompts"][:8]
        workload = pathlib.Path("/tmp/pacer_w_quick.json")
        workload.write_text(json.dumps(w))
    return workload


def run_vllm(dtype: str, quick: bool, repeats: int) -> tuple[float, list[float]] | None:
    workload = w_file(quick)
    res = _vllm(PEERS / "vllm_offline.py", dtype, "--workload", str(workload), "--repeats", str(repeats))
    if res is None:
        return None
    runs = [float(t) for t in res["runs_s"]]   # its own output_tok_s is the best run: use the median
    return float(res["output_tokens"]) / stat(runs), runs


def run_llamacpp(threads: int, quick: bool, repeats: int, n: int, w: bool = True) -> dict | None:
    """llama.cpp on pacer's own GGUF: W (one multi-sequence batch; `w`) and batch-1 decode, its RESULT."""
    py = PEERS_DIR / "llamacpp-venv" / "bin" / "python"
    if not (py.is_file() and PEERS):
        line(f"  llama.cpp: skipped (build it with: PEERS_DIR={PEERS_DIR} bash ../shared/peers/setup.sh llamacpp)")
        return None
    from pacer.model.loader import default_model_path
    workload = w_file(quick)
    cmd = [str(py), str(HERE / "llamacpp_peer.py"), "--model", str(default_model_path()), "--threads", str(threads),
           *(["--workload", str(workload)] if w else []), "--repeats", str(repeats), "--tokens", str(n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    for out_line in proc.stdout.splitlines():
        if out_line.startswith("RESULT "):
            return dict(json.loads(out_line[len("RESULT "):]))
    line(f"  llama.cpp: failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    return None


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


def w_line(label: str, r: dict[str, tuple[float, list[float]] | None], repeats: int) -> str:
    """One W line: every pacer weight format, then the peers, with pacer (first format)'s ratios."""
    names = [k for k in r if k.startswith("pacer")]
    pacer = (r[names[0]] or (0.0, []))[0]
    parts = [f"{k} {v[0]:.1f} ({runs_text(v[1])})" for k in names if (v := r[k])]
    for other in names[1:]:
        if (q := r[other]) and pacer:
            parts.append(f"{other}/{names[0]} {q[0] / pacer:.2f}x")
    for key, title in (("hf", "HF static"), ("vllm", "vLLM"), ("llamacpp", "llama.cpp Q4_1")):
        if (v := r.get(key)):
            parts.append(f"{title} {v[0]:.1f} ({runs_text(v[1])}; pacer/{title.split()[0]} {pacer / v[0]:.2f}x)")
        elif key == "vllm" and label in VLLM_REFERENCE:
            parts.append(f"vLLM (peers/README, not this run) {VLLM_REFERENCE[label][0]:.1f}")
    return f"[W {label}] output tok/s, median of {repeats}: " + " | ".join(parts)


def run_w(dtype: str, args: argparse.Namespace, w_prompts: list[list[int]], w_outs: list[int],
          b1: dict[str, float]) -> dict[str, tuple[float, list[float]] | None]:
    """Workload W (and batch-1 decode) on pacer in `dtype`, one run per weight format."""
    r: dict[str, tuple[float, list[float]] | None] = {}
    weights = args.weights.split(",") if dtype == "float32" else ["none"]
    for wfmt in weights:
        quant, _, act = wfmt.partition("+")   # e.g. gguf+int8: packed weights, int8 activations
        llm = LLM(dtype=dtype, max_num_seqs=256, max_num_batched_tokens=args.max_num_batched_tokens,
                  enable_prefix_caching=False, kv_cache_memory="2GiB", quantization=quant,
                  quant_activations=act or "float")
        name = "pacer" if wfmt == "none" else f"pacer-{wfmt}"
        if not args.batch1_only:
            r[name] = run_pacer(llm, w_prompts, w_outs, args.repeats)
        b1[f"{dtype} {name}"] = batch1_decode_ms(llm, args.repeats, args.batch1_tokens)
        if dtype == "float32" and wfmt == "none" and not args.batch1_only:
            line("[step split] " + step_split(llm, 16 if args.quick else 64))
        del llm
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--weights", default="none,gguf,gguf+int8",
                    help="pacer's weight formats for float32, none first (gguf+int8: int8 activations)")
    ap.add_argument("--quick", action="store_true", help="small workloads (smoke run)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--skip-varied", action="store_true")
    ap.add_argument("--batch1-only", action="store_true", help="only batch-1 decode, every engine (no W, no varied)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per engine and workload (median reported)")
    ap.add_argument("--batch1-tokens", type=int, default=128)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default="native", choices=["native", "avx2"],
                    help="avx2: every engine held to its AVX2 paths (an AVX2-only CPU's stand-in; isa_switch.py)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtypes, reps = args.dtypes.split(","), args.repeats
    line(f"# pacer offline throughput, torch {torch.__version__}, {torch.get_num_threads()} threads, "
         f"{reps} timed runs per engine (median), {isa_switch.label()}, load average {loadavg()}")
    w_prompts, w_outs = load_w(args.quick)
    b1: dict[str, float] = {}
    peer_b1: dict[str, float] = {}
    result: dict[str, Any] = {"w": {}, "varied": {}}   # the RESULT line, for cpu_verdicts.py
    for dtype in dtypes:
        r = run_w(dtype, args, w_prompts, w_outs, b1)
        if not args.skip_hf and dtype == "float32" and not args.batch1_only:
            r["hf"] = run_hf_static(hf_model(torch.float32), w_prompts, w_outs, reps)
        if not args.skip_vllm:
            if not args.batch1_only:
                r["vllm"] = run_vllm(dtype, args.quick, reps)
            if (ms := run_vllm_batch1(dtype, reps, args.batch1_tokens)) is not None:
                peer_b1[f"vLLM {dtype}"] = ms
        if not args.skip_llamacpp and dtype == "float32" and (lc := run_llamacpp(args.threads, args.quick, reps,
                                                                                args.batch1_tokens,
                                                                                not args.batch1_only)):
            if "runs_s" in lc:
                r["llamacpp"] = (lc["output_tokens"] / stat(lc["runs_s"]), lc["runs_s"])
            line(f"  llama.cpp {lc.get('version', '?')} built for: {lc.get('simd', '?')}")
            result["llamacpp_simd"] = lc.get("simd", "?")
            peer_b1["llama.cpp Q4_1"] = batch1_ms(lc["runs_one_s"], lc["runs_many_s"], args.batch1_tokens)
        if not args.batch1_only:
            line(w_line(dtype, r, reps) + f" | load {loadavg()}")
            result["w"][dtype] = {k: v[0] for k, v in r.items() if v}
    batch1_lines(b1, peer_b1, args.batch1_tokens, reps)
    result["batch1_ms"] = {**b1, **peer_b1}
    if not (args.skip_varied or args.batch1_only):
        result["varied"]["float32"] = varied_line(args)
    line(f"# load average at the end {loadavg()}")
    line("RESULT " + json.dumps(result))


def batch1_lines(b1: dict[str, float], peers: dict[str, float], n: int, reps: int) -> None:
    for name, ms in b1.items():
        dtype = name.split()[0]
        others = " | ".join(f"{k} {v:.1f} ms ({k.split()[0]}/pacer {v / ms:.2f}x)" for k, v in peers.items()
                            if k.endswith(dtype) or k.startswith("llama.cpp"))
        line(f"[batch-1 decode {name}] (t(1+{n}) - t(1)) / {n}, medians of {reps}: {ms:.1f} ms/token"
             f"{' | ' + others if others else ''} | memory-bandwidth floor ~{FLOOR_MS.get(dtype)} ms (float weights)")


def varied_line(args: argparse.Namespace) -> dict[str, float]:
    """The varied-length workload on pacer (each weight format of `--weights`), HF static batching
    and vLLM float32 (the same prompts and exact output lengths through vllm_offline.py)."""
    reps = args.repeats
    n_var = 16 if args.quick else 64
    v_prompts, v_outs = varied_workload(n_var)
    parts = []
    pv = 0.0
    out: dict[str, float] = {}   # engine -> output tok/s
    for wfmt in args.weights.split(","):
        quant, _, act = wfmt.partition("+")
        llm = LLM(dtype="float32", max_num_seqs=256, max_num_batched_tokens=args.max_num_batched_tokens,
                  enable_prefix_caching=False, kv_cache_memory="4GiB", quantization=quant,
                  quant_activations=act or "float")
        tok_s, runs = run_pacer(llm, v_prompts, v_outs, reps)
        del llm
        name = "pacer" if wfmt == "none" else f"pacer-{wfmt}"
        pv = pv or tok_s
        out[name] = tok_s
        parts.append(f"{name} {tok_s:.1f} ({runs_text(runs)})" + (f"; {name}/pacer {tok_s / pv:.2f}x" if pv != tok_s else ""))
    if not args.skip_hf:
        hv, hv_runs = run_hf_static(hf_model(torch.float32), v_prompts, v_outs, reps)
        out["hf"] = hv
        parts.append(f"HF static batch {hv:.1f} ({runs_text(hv_runs)}; pacer/HF {pv / hv:.2f}x)")
    if not args.skip_vllm:
        path = pathlib.Path(tempfile.gettempdir()) / f"pacer_varied_{n_var}.json"
        path.write_text(json.dumps({"prompts": v_prompts, "output_lens": v_outs}))
        res = _vllm(PEERS / "vllm_offline.py", "float32", "--workload", str(path), "--repeats", str(reps))
        if res is not None:
            vruns = [float(t) for t in res["runs_s"]]
            vv = float(res["output_tokens"]) / stat(vruns)
            out["vllm"] = vv
            parts.append(f"vLLM {vv:.1f} ({runs_text(vruns)}; pacer/vLLM {pv / vv:.2f}x)")
    line(f"[varied {n_var} req, prompts 32..1024, outputs 16..256] output tok/s, "
         f"median of {reps}: " + " | ".join(parts) + f" | load {loadavg()}")
    return out


def loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
