"""Cross-request segment reuse (issue 28): agent prompts whose tool outputs (real text from
`pacer.corpus`, 200-2,000 tokens) appear after different histories. N sessions (each its own
history) receive the same K tool outputs; request (session i, tool j) is system prompt + history
i + tool output j + a question, rendered with the chat template (the tool message's content is
the segment; a base model without one gets a plain "role: content" transcript after BOS). Modes: prefix caching alone (off), and approximate reuse at several recompute
fractions, every engine loaded at once. Per mode: TTFT p50 / p99 (wall), the process CPU seconds
per request (p50: less sensitive to a loaded machine) and prompt tokens computed, each request run
on every engine in turn (first token only); then quality against full prefill (the prefix-caching
engine: exact KV) on the requests that reused a segment: greedy agreement over the reference's 32 greedy tokens (teacher-forced), mean per-token
KL(full || mode) of the next-token distribution over them, and the change in the reference
continuation's mean log-likelihood.

    PYTHONPATH=src python benchmarks/segment_reuse.py [--sessions 5] [--tools 300,700,1400]
        [--recompute 0,auto,0.15,0.3] [--threads 1] [--repeats 2] [--skip-quality] [--quantization auto|none]
        [--model PATH]   # e.g. the Gemma 3 270M GGUF: see `pacer.model.loader.packaged_model_path`

Numbers depend on the machine and its load (printed); nothing here asserts.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import torch

from pacer.llm import LLM
from pacer.model.kernels import cpu_flags
from pacer.request import SamplingParams
from pacer.workload.text import TextSource
from slo_common import loadavg

CONTINUATION = 32
# for a base model (no chat template): the transcript the segments sit in
PLAIN_TRANSCRIPT = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n\n{% endfor %}"
                    "{% if add_generation_prompt %}assistant:{% endif %}")


def cpu_flag_line() -> str:
    found = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in cpu_flags()]
    return ",".join(found) or "none of avx2/avx512"


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def build_prompts(llm: LLM, sessions: int, tool_lens: list[int], seed: int) -> list[tuple[list[int], list[Any]]]:
    """(token ids, segments) per request, tool by tool: session 0 meets each tool output first."""
    rng = random.Random(seed)
    src = TextSource(llm.tokenizer)
    histories = [src.segment(rng.randint(120, 320), rng).text for _ in range(sessions)]
    tools = [src.segment(n, rng).text for n in tool_lens]
    out = []
    for j, tool in enumerate(tools):
        for hist in histories:
            msgs = [{"role": "system", "content": "You are a research assistant. Answer from the tool results."},
                    {"role": "user", "content": hist},
                    {"role": "assistant", "content": f"I will call the search tool (call {j})."},
                    {"role": "tool", "content": tool},
                    {"role": "user", "content": "What is the most important fact in the tool result?"}]
            template = None if llm.tokenizer.hf.chat_template else PLAIN_TRANSCRIPT
            ids, spans = llm.tokenizer.chat_segments(msgs, ("tool",), chat_template=template)
            out.append((ids, spans))
    return out


class LogitCapture:
    """Wraps the model's forward: also returns the logits of every row at position >= `lo`
    (requests run one at a time, so positions name rows)."""

    def __init__(self, model: Any) -> None:
        self.model, self.forward = model, model.forward
        self.lo: int | None = None
        self.rows: dict[int, torch.Tensor] = {}
        model.forward = self

    def __call__(self, input_ids: Any, positions: Any, meta: Any, kv_caches: Any, logits_rows: Any,
                 kv_format: Any = None) -> torch.Tensor:
        if self.lo is None:
            return self.forward(input_ids, positions, meta, kv_caches, logits_rows, kv_format)
        sel = (positions >= self.lo).nonzero().flatten()
        out = self.forward(input_ids, positions, meta, kv_caches, torch.cat([logits_rows, sel]), kv_format)
        for i, p in enumerate(positions[sel].tolist()):
            self.rows[p] = out[len(logits_rows) + i].float().log_softmax(-1)
        return out[:len(logits_rows)]


def make_llm(args: argparse.Namespace, **kw: Any) -> LLM:
    torch.set_num_threads(args.threads)
    llm = LLM(model=args.model, num_kv_blocks=args.kv_blocks, quantization=args.quantization, **kw)
    llm.generate("Warm up the kernels with a short prompt about the weather.", SamplingParams(max_tokens=4))
    llm.engine.kv.reset_prefix_cache()
    return llm


def ttft_pass(engines: dict[str, LLM], prompts: list[tuple[list[int], list[Any]]],
              repeats: int) -> dict[str, dict[str, Any]]:
    """Each request on every engine in turn (so the machine's load falls on all modes alike), the
    whole workload `repeats` times from empty caches: TTFT (wall), the process CPU seconds of the
    request, prompt tokens computed / reused / recomputed (of the first repeat)."""
    rec: dict[str, dict[str, list[float]]] = {m: {"ttft": [], "cpu": [], "computed": [], "reused": [], "recomputed": []}
                                              for m in engines}
    for (ids, spans), rep in [(p, r) for r in range(repeats) for p in prompts]:
        if (ids, spans) is prompts[0] and rep:
            for llm in engines.values():
                llm.engine.kv.reset_prefix_cache()
        for mode, llm in engines.items():
            c0 = time.process_time()
            o = llm.generate(ids, SamplingParams(max_tokens=1, temperature=0), segments=spans)[0]
            r = rec[mode]
            r["cpu"].append(time.process_time() - c0)
            r["ttft"].append(o.metrics.ttft)
            r["computed"].append(o.metrics.prefill_tokens)
            r["reused"].append(o.metrics.segment_reused_tokens)
            r["recomputed"].append(o.metrics.segment_recomputed_tokens)
    n = len(prompts)
    return {m: {"p50": pct(r["ttft"], 50), "p99": pct(r["ttft"], 99), "cpu50": pct(r["cpu"], 50),
                "computed": int(sum(r["computed"][:n])), "reused": int(sum(r["reused"][:n])),
                "recomputed": int(sum(r["recomputed"][:n]))} for m, r in rec.items()}


def logprob_pass(llm: LLM, prompts: list[tuple[list[int], list[Any]]],
                 conts: list[list[int]]) -> tuple[list[torch.Tensor], list[int]]:
    """Per request: log-softmax rows [32, vocab] predicting its continuation (teacher-forced), and
    the tokens it reused from the segment store."""
    cap = LogitCapture(llm.engine._executor.model)
    rows, reused = [], []
    for (ids, spans), cont in zip(prompts, conts):
        cap.lo, cap.rows = len(ids) - 1, {}
        out = llm.generate(ids + cont[:-1], SamplingParams(max_tokens=1, temperature=0), segments=spans)[0]
        rows.append(torch.stack([cap.rows[len(ids) - 1 + t] for t in range(len(cont))]))
        reused.append(out.metrics.segment_reused_tokens)
    cap.lo = None
    return rows, reused


def quality(ref: list[torch.Tensor], got: list[torch.Tensor], conts: list[list[int]], mask: list[bool]) -> dict[str, float]:
    agree, kls, dll = [], [], []
    for r, g, c, m in zip(ref, got, conts, mask):
        if not m:
            continue
        agree.append((r.argmax(-1) == g.argmax(-1)).float().mean().item())
        kls.append((r.exp() * (r - g)).sum(-1).mean().item())
        idx = torch.tensor(c).unsqueeze(1)
        dll.append((g.gather(1, idx).mean() - r.gather(1, idx).mean()).item())
    if not agree:
        return {"n": 0, "agree": float("nan"), "kl": float("nan"), "dll": float("nan")}
    return {"n": len(agree), "agree": statistics.mean(agree), "kl": statistics.mean(kls), "dll": statistics.mean(dll)}


def simulate(prompts: list[tuple[list[int], list[Any]]], modes: dict[str, dict[str, Any]], kv_blocks: int,
             hardware: str = "cpu-local") -> dict[str, float]:
    """The same requests, one at a time, on the simulator (the real scheduler and KV bookkeeping,
    the step cost model of `hardware` for SmolLM2-135M, segment copies priced per token): TTFT p50."""
    from pacer.config import EngineConfig
    from pacer.perf.profiles import get_hardware, get_model
    from pacer.sim.simulator import build_sim_engine

    out = {}
    for label, kw in modes.items():
        eng, _, clock = build_sim_engine(EngineConfig.from_kwargs(num_kv_blocks=kv_blocks, **kw),
                                         get_hardware(hardware), get_model("smollm2-135m"))
        ttfts = []
        for ids, spans in prompts:
            rid = eng.add_request(eng.prepare(ids, SamplingParams(max_tokens=1), segments=spans))
            done = None
            while done is None:
                done = next((o for o in eng.step() if o.request_id == rid and o.finished), None)
            ttfts.append(done.metrics.ttft or 0.0)
        out[label] = pct(ttfts, 50)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--tools", default="300,700,1400", help="tool output lengths in tokens")
    ap.add_argument("--recompute", default="0,auto,0.15,0.3", help="approximate modes' recompute fractions")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: no OpenMP spinning on shared cores)")
    ap.add_argument("--kv-blocks", type=int, default=640)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="TTFT passes over the workload, from empty caches")
    ap.add_argument("--skip-quality", action="store_true", help="TTFT only")
    ap.add_argument("--model", default=None, help="a GGUF or HF directory (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--quantization", default="auto",
                    help="the weights every engine runs (auto: the GGUF packed, int8 activations; none: float32)")
    args = ap.parse_args()
    print(f"cpu flags: {cpu_flag_line()}; torch threads {args.threads}; quantization {args.quantization}; "
          f"load average {loadavg()} (start)")
    probe = LLM(model=args.model, num_kv_blocks=64, quantization=args.quantization)
    print(f"model {probe.engine._executor.model.arch.name}: {probe.engine._executor.model.weights_line()}")
    prompts = build_prompts(probe, args.sessions, [int(x) for x in args.tools.split(",")], args.seed)
    probe.close()
    lens = [len(ids) for ids, _ in prompts]
    print(f"{len(prompts)} requests ({args.sessions} sessions x tool outputs of {args.tools} tokens), "
          f"prompts {min(lens)}-{max(lens)} tokens; reference continuation {CONTINUATION} greedy tokens")
    t0 = time.perf_counter()
    modes: dict[str, dict[str, Any]] = {"off (prefix caching)": {}}
    modes.update({f"approximate r={r}": {"segment_reuse": "approximate",
                                         "segment_recompute": r if r == "auto" else float(r)}
                  for r in args.recompute.split(",")})
    engines = {label: make_llm(args, **kw) for label, kw in modes.items()}
    timing = ttft_pass(engines, prompts, args.repeats)
    # the simulator's step cost model is SmolLM2-135M's: no prediction for another model
    simulated = args.model is None
    if args.skip_quality:
        sim = simulate(prompts, modes, args.kv_blocks) if simulated else {}
        for label, t in timing.items():
            print(f"{label:22s} TTFT p50 {t['p50'] * 1e3:7.0f}ms p99 {t['p99'] * 1e3:7.0f}ms cpu p50 {t['cpu50']:.2f}s "
                  f"computed {t['computed']} reused {t['reused']} recomputed {t['recomputed']}"
                  + (f"; simulated TTFT p50 {sim[label] * 1e3:.0f}ms" if simulated else ""))
        print(f"load average {loadavg()} (end)")
        return
    ref_llm = engines["off (prefix caching)"]   # exact KV: the reference continuation and distributions
    conts = [list(o.token_ids) for o in ref_llm.generate(
        [ids for ids, _ in prompts], SamplingParams(max_tokens=CONTINUATION, temperature=0, ignore_eos=True))]
    print(f"{'mode':22s} {'TTFT p50':>9s} {'p99':>9s} {'cpu p50':>8s} {'computed':>9s} {'reused':>7s} {'recomp':>7s} "
          f"{'agree':>6s} {'KL':>8s} {'dLL':>8s} (n)")
    ref: list[torch.Tensor] = []
    base = timing["off (prefix caching)"]
    for label, llm in engines.items():
        llm.engine.kv.reset_prefix_cache()
        rows, reused = logprob_pass(llm, prompts, conts)
        ref = ref or rows
        q = quality(ref, rows, conts, [n > 0 for n in reused]) if modes[label] else {
            "n": len(rows), "agree": 1.0, "kl": 0.0, "dll": 0.0}
        t = timing[label]
        print(f"{label:22s} {t['p50'] * 1e3:7.0f}ms {t['p99'] * 1e3:7.0f}ms {t['cpu50']:7.2f}s {t['computed']:9d} "
              f"{t['reused']:7d} {t['recomputed']:7d} {q['agree']:6.3f} {q['kl']:8.4f} {q['dll']:+8.4f} ({q['n']})  "
              f"TTFT p50 {100 * (t['p50'] / base['p50'] - 1):+.0f}%, cpu p50 {100 * (t['cpu50'] / base['cpu50'] - 1):+.0f}%"
              f" vs off", flush=True)
    for llm in engines.values():
        llm.close()
    real = {label: t["p50"] / base["p50"] for label, t in timing.items()}
    if simulated:
        sim = simulate(prompts, modes, args.kv_blocks)
        print("TTFT p50 / off, real vs simulated (cpu-local profile): " + "; ".join(
            f"{label.removeprefix('approximate ')} {real[label]:.2f} vs {sim[label] / sim['off (prefix caching)']:.2f}"
            for label in modes if modes[label]))
    print(f"load average {loadavg()} (end); {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
