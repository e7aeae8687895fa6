"""vLLM (CPU)'s time op by op, run in vLLM's own venv by op_profile.py (issue 26, item 1).

One workload (`--requests` x `--prompt` tokens, `--output` tokens each, greedy, ignore_eos,
token ids in) through `vllm.LLM.generate` in this process (V1 multiprocessing off, so the
model runs here) under `torch.profiler`; each op's self CPU time is put in the part op_profile.py
uses for pacer: linear projections, the LM head (the matmul whose weight has the vocabulary's
rows), attention, rope + KV write, RMSNorm, SiLU-and-mul, the sampler (its ops: softmax, sort,
argmax, ...), the compiled graph (vLLM compiles the model with torch.compile: the elementwise work
between the custom ops, norms and SiLU among it, runs there as one fused call), the rest of the
ops, and the Python around them (the wall time no op accounts
for). The same run without the profiler is timed first: the profiler costs a few microseconds
per op, which shows where steps are many small ops (decode). Prints one RESULT line of JSON:
{"parts": {part: seconds}, "total": wall seconds profiled, "unprofiled": wall seconds, "ops": the
ten costliest op names}.

    VLLM_CPU_OMP_THREADS_BIND=0 $PEERS_DIR/vllm-venv/bin/python vllm_op_profile.py \
        --model $PEERS_DIR/smollm2-hf --requests 8 --prompt 512 --output 1
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

RULES = (   # (substring of the op's name, part), first match wins
    ("compiledfxgraph", "compiled graph"), ("silu_and_mul", "silu_and_mul"), ("rms_norm", "norm"),
    ("rotary", "rope+kv write"), ("reshape_and_cache", "rope+kv write"), ("kv_cache_update", "rope+kv write"),
    ("attention", "attention"), ("attn", "attention"), ("sdpa", "attention"), ("softmax", "sampler"),
    ("sort", "sampler"), ("argmax", "sampler"), ("topk", "sampler"), ("top_k", "sampler"),
    ("multinomial", "sampler"), ("gemm", "linear"), ("linear", "linear"), ("addmm", "linear"),
    ("aten::mm", "linear"), ("matmul", "linear"), ("onednn_mm", "linear"),
)


def part_of(name: str) -> str:
    low = name.lower()
    return next((part for key, part in RULES if key in low), "forward other")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--prompt", type=int, required=True)
    ap.add_argument("--output", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the same as pacer's)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(os.path.dirname(args.model), ".vllm-cache"))
    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=2048, seed=0, enable_prefix_caching=False)
    torch.set_num_threads(args.threads)   # in this process the model runs on torch's pool
    vocab = llm.llm_engine.model_config.get_vocab_size()
    prompts = [TokensPrompt(prompt_token_ids=[1000 + (i * 131 + j * 7) % 20000 for j in range(args.prompt)])
               for i in range(args.requests)]
    params = SamplingParams(max_tokens=args.output, min_tokens=args.output, ignore_eos=True, temperature=0.0)
    llm.generate(prompts[:2], params, use_tqdm=False)   # warm-up
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    unprofiled = time.perf_counter() - t   # the profiler's own cost per op shows against this
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        total = time.perf_counter() - t
    parts: dict[str, float] = defaultdict(float)
    ops: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages(group_by_input_shape=True):
        s = ev.self_cpu_time_total / 1e6
        if s <= 0:
            continue
        part = part_of(ev.key)
        if part == "linear" and any(str(vocab) in str(shape) for shape in (ev.input_shapes or [])):
            part = "lm_head"
        parts[part] += s
        ops[ev.key] += s
    parts["engine python"] = max(0.0, total - sum(parts.values()))
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:10]
    print("RESULT", json.dumps({"parts": dict(parts), "total": total, "unprofiled": unprofiled, "threads": torch.get_num_threads(),
                                "ops": [[k, round(v, 4)] for k, v in top]}))


if __name__ == "__main__":
    main()
