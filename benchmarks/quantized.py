"""Quantized weights run as shipped, against the dequantized float32 path, side by side in one run.

Models, all from the default GGUF (SmolLM2-135M-Instruct Q4_1, its LM head Q8_0): `float32`
(`--quantization none`, the reference), `q-float` (packed blocks, float activations),
`q-int8` (packed blocks, int8 activations per token and block of 32: the default engine's).

Quality: each held-out chat's prompt (16 of them; `--chats N` takes the first N) plus the
reference's own 64 greedy tokens, teacher-forced through every model in one prefill; per-token
KL(float32 || model) and greedy (top-1) agreement over the 64 generated positions, with
disagreements where the reference's top two are within `--tie` nats counted as near-ties. Speed: model.forward timed directly (no scheduler), the models
interleaved each repeat, medians: batch-1 decode ms/token at a 128-token context, decode
throughput of 32 sequences, and prefill tokens/s of one 256-token chunk. Load average and the
CPU's flags are printed beside the figures.

    PYTHONPATH=src python benchmarks/quantized.py [--threads 2] [--repeats 15] [--isa native|avx2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import isa_switch

isa_switch.apply()   # before torch is imported: `--isa avx2` holds every library to AVX2

import torch  # noqa: E402

from pacer.model.attention import ChunkSpan, build_metadata  # noqa: E402
from pacer.model.llama import LlamaModel  # noqa: E402
from pacer.model.loader import load_checkpoint, quantize_checkpoint  # noqa: E402

CHATS = [
    "Explain in two sentences why the sky looks blue at noon and red at sunset.",
    "Write a short Python function that checks whether a string is a palindrome.",
    "My tomato plants have yellow leaves at the bottom. What could be wrong?",
    "Give me three ideas for a rainy Sunday afternoon with two kids.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet in three sentences.",
    "How do I politely decline a meeting invitation from my manager?",
    "Translate 'Where is the train station?' into French and Spanish.",
    "Why do cats purr? Give a short answer.",
    "Write a haiku about autumn leaves.",
    "What should I pack for a three-day hiking trip in the mountains?",
    "Explain what a hash table is to a beginner programmer.",
    "Suggest a name for a small bakery that sells sourdough bread.",
    "How many minutes are there in a week? Show the steps.",
    "What are the health benefits of drinking water regularly?",
    "Write a two-line SQL query that counts the rows of a table named orders.",
]
BS = 16


def load_line() -> str:
    a, b, c = os.getloadavg()
    return f"load {a:.2f} {b:.2f} {c:.2f}"


def forward(model: LlamaModel, kv: Any, seqs: list[tuple[list[int], int]], all_rows: bool = False) -> torch.Tensor:
    """One step: each seq is (token ids of this step, start position); a seq owns blocks from
    `i * blocks_per_seq` on. Single-token rows first, as the executor packs them."""
    per_seq = 512 // BS
    ids, pos, slots, single_tables, lens, chunks = [], [], [], [], [], []
    for i, (toks, start) in sorted(enumerate(seqs), key=lambda e: len(e[1][0]) > 1):
        table = list(range(i * per_seq, i * per_seq + (start + len(toks) + BS - 1) // BS))
        if len(toks) == 1:
            single_tables.append(table)
            lens.append(start + 1)
        else:
            chunks.append(ChunkSpan(len(ids), len(toks), start, table))
        ids += toks
        pos += range(start, start + len(toks))
        slots += [table[p // BS] * BS + p % BS for p in range(start, start + len(toks))]
    meta = build_metadata(slots, single_tables, lens, chunks, BS, "cpu", model.kernel is not None)
    rows = torch.arange(len(ids)) if all_rows else torch.arange(len(seqs)) if not chunks else torch.tensor(
        [c.q_start + c.q_len - 1 for c in chunks])
    return model.forward(torch.tensor(ids), torch.tensor(pos), meta, kv, rows)


def greedy(model: LlamaModel, kv: Any, prompt: list[int], n: int) -> list[int]:
    out = [int(forward(model, kv, [(prompt, 0)])[-1].argmax())]
    for i in range(n - 1):
        out.append(int(forward(model, kv, [([out[-1]], len(prompt) + i)])[0].argmax()))
    return out


def quality(models: dict[str, LlamaModel], kvs: dict[str, Any], tok: Any, n: int, tie: float,
            chats: list[str]) -> dict[str, dict[str, float]]:
    ref_name = "float32"
    stats: dict[str, list[float]] = {k: [] for k in models if k != ref_name}
    agree = {k: [0, 0, 0] for k in stats}   # same top-1, near-tie misses, other misses
    for chat in chats:
        prompt = tok.apply_chat_template([{"role": "user", "content": chat}])
        cont = greedy(models[ref_name], kvs[ref_name], prompt, n)
        seq = prompt + cont
        sl = slice(len(prompt) - 1, len(seq) - 1)   # the rows that predicted the n generated tokens
        ref = torch.log_softmax(forward(models[ref_name], kvs[ref_name], [(seq, 0)], True)[sl], -1)
        top2 = ref.topk(2, dim=-1).values
        for name in stats:
            lp = torch.log_softmax(forward(models[name], kvs[name], [(seq, 0)], True)[sl], -1)
            kl = (ref.exp() * (ref - lp)).sum(-1)
            stats[name] += kl.tolist()
            same = lp.argmax(-1) == ref.argmax(-1)
            near = (~same) & ((top2[:, 0] - top2[:, 1]) < tie)
            agree[name][0] += int(same.sum())
            agree[name][1] += int(near.sum())
            agree[name][2] += int((~same & ~near).sum())
    out = {}
    for name, kls in stats.items():
        s, t, o = agree[name]
        out[name] = {"kl_mean": statistics.fmean(kls), "kl_max": max(kls), "agreement": s / (s + t + o),
                     "near_ties": t, "other": o, "tokens": n}
        print(f"quality {name:8s} vs float32, {len(chats)} chats x {n} tokens: KL mean {statistics.fmean(kls):.2e} "
              f"max {max(kls):.2e}; greedy agreement {s / (s + t + o):.1%} ({t} near-ties < {tie} nats, "
              f"{o} other) | {load_line()}", flush=True)
    return out


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def speed(models: dict[str, LlamaModel], kvs: dict[str, Any], repeats: int) -> dict[str, dict[str, float]]:
    ctx = 128
    prompt = list(range(300, 300 + ctx))
    batch = [([1000 + i], ctx) for i in range(32)]
    chunk = list(range(500, 756))
    runs: dict[str, dict[str, list[float]]] = {k: {"b1": [], "b32": [], "pre": []} for k in models}
    for name, m in models.items():   # warm-up (the KV's contents do not matter for timing)
        forward(m, kvs[name], [(prompt, 0)])
    for _ in range(repeats):
        for name, m in models.items():
            kv = kvs[name]
            runs[name]["b1"].append(timed(lambda m=m, kv=kv: forward(m, kv, [([7], ctx)])))
            runs[name]["b32"].append(timed(lambda m=m, kv=kv: forward(m, kv, batch)))
            runs[name]["pre"].append(timed(lambda m=m, kv=kv: forward(m, kv, [(chunk, 0)])))
    med = {k: {s: statistics.median(v) for s, v in r.items()} for k, r in runs.items()}
    f32 = med["float32"]
    for name, r in med.items():
        print(f"speed {name:8s} ({models[name].weights_line()}): batch-1 decode {r['b1'] * 1e3:.1f} ms/token "
              f"({f32['b1'] / r['b1']:.2f}x float32); 32-seq decode {32 / r['b32']:.0f} tok/s "
              f"({f32['b32'] / r['b32']:.2f}x); prefill 256 {256 / r['pre']:.0f} tok/s ({f32['pre'] / r['pre']:.2f}x) "
              f"| {load_line()}", flush=True)
    return {name: {"b1_ms": r["b1"] * 1e3, "b32_tok_s": 32 / r["b32"], "prefill_tok_s": 256 / r["pre"],
                   "b1_x": f32["b1"] / r["b1"], "b32_x": f32["b32"] / r["b32"], "prefill_x": f32["pre"] / r["pre"]}
            for name, r in med.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads")
    ap.add_argument("--repeats", type=int, default=15, help="timed repeats per figure (medians)")
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per chat for the quality check")
    ap.add_argument("--tie", type=float, default=0.01, help="a reference top-2 gap (nats) counted as a near-tie")
    ap.add_argument("--chats", type=int, default=len(CHATS), help="held-out chats for the quality check (the first N)")
    ap.add_argument("--isa", default="native", choices=["native", "avx2"],
                    help="avx2: every library held to its AVX2 paths, float32's oneDNN too (isa_switch.py)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = load_checkpoint(None)
    quantize_checkpoint(ckpt, "gguf")
    models = {
        "float32": LlamaModel(ckpt.arch, ckpt.tensors, torch.float32),
        "q-float": LlamaModel(ckpt.arch, ckpt.tensors, torch.float32, quantized=ckpt.quantized),
        "q-int8": LlamaModel(ckpt.arch, ckpt.tensors, torch.float32, quantized=ckpt.quantized,
                             quant_activations="int8"),
    }
    kvs = {k: m.allocate_kv_cache(32 * 512 // BS, BS) for k, m in models.items()}
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} | threads {args.threads} | {isa_switch.label()} "
          f"| {load_line()}", flush=True)
    with torch.inference_mode():
        result = {"quality": quality(models, kvs, ckpt.tokenizer, args.tokens, args.tie, CHATS[:args.chats]),
                  "speed": speed(models, kvs, args.repeats)}
    print("RESULT " + json.dumps(result), flush=True)   # for cpu_verdicts.py


if __name__ == "__main__":
    main()
