"""Speculative decoding as a scheduling decision: off vs static (always k, vLLM's) vs adaptive.

On the default model (SmolLM2-135M-Instruct, CPU), three engines over one loaded model, the
workloads run interleaved (off, static, adaptive, then again) and medians are printed with
the load average (the machine is shared):

- batch 1, editing: "fix any typos" over a paragraph; first checks that the model's greedy
  output copies >= 80% of the text (otherwise the workload does not test what it claims);
  target: TPOT >= 2x faster than off;
- batch 1, plain chat: target within 5% of off;
- 32 concurrent mixed requests (editing and chat): target adaptive >= 0.97x off throughput;
  static's collapse is printed beside it;
- every greedy output compared with off (identical count).

    PYTHONPATH=src python benchmarks/spec_decode.py            # full size
    PYTHONPATH=src python benchmarks/spec_decode.py --reduced  # a few minutes
"""

from __future__ import annotations

import argparse
import difflib
import os
import statistics
import time
from typing import Any

import torch

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.engine.build import step_cost_model
from pacer.model.runner import executor_for
from pacer.request import SamplingParams

MODES = ("off", "static", "adaptive")
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
TEXTS = [
    "Dear team, the quarterly review meeting will take place on Monday at 10am in conference room 4. Please "
    "bring the budget report, the sales figures for the last three months, and your project updates. Lunch will "
    "be served after the meeting in the cafeteria. If you cannot attend, send your update to Maria by Friday so "
    "that she can present it on your behalf. Thank you, and see you on Monday.",
    "The new library opens next week on Main Street. It has a large reading room, a children's corner with "
    "picture books, and twenty computers that visitors can use for free. The library is open from nine in the "
    "morning until eight in the evening, every day except Sunday. Membership is free for everyone who lives in "
    "the city.",
    "To install the tool, download the latest release from the website and unpack the archive into a folder of "
    "your choice. Then open a terminal in that folder and run the setup script. The script checks your system, "
    "installs the missing libraries, and creates a configuration file in your home directory. When it finishes, "
    "restart the terminal and type the name of the tool to start it.",
]
CHATS = ["Write a short story about a robot who learns to paint.", "Explain why the sky is blue to a child.",
         "What are three tips for learning a new language?", "Describe a perfect day at the beach.",
         "Why do cats purr?", "Give me a recipe for a simple tomato soup.",
         "What is the difference between weather and climate?", "Write a poem about autumn leaves."]
EDIT = "Fix any typos in the following text and output the full corrected text:\n\n"


def build_engines(num_blocks: int, threads: int) -> dict[str, Engine]:
    torch.set_num_threads(threads)
    base = Engine.from_kwargs(num_kv_blocks=16, num_threads=threads)
    from pacer.model.loader import load_checkpoint

    arch = load_checkpoint(None).arch
    engines = {}
    for mode in MODES:
        kw: dict[str, Any] = {"num_kv_blocks": num_blocks}
        if mode != "off":
            kw.update(speculative_config=SPEC, speculative_policy=mode)
        cfg = EngineConfig.from_kwargs(**kw)
        ex = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
        cm = step_cost_model(cfg, arch) if mode == "adaptive" else None
        engines[mode] = Engine(cfg, ex, base.tokenizer, ex.num_blocks, base.max_model_len, base.eos_token_ids,
                               vocab_size=base.vocab_size, cost_model=cm)
    return engines


def chat_ids(eng: Engine, text: str) -> list[int]:
    return list(eng.tokenizer.apply_chat_template([{"role": "user", "content": text}]))


def run(eng: Engine, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """All prompts at once, greedy; wall time, outputs, per-request TPOT/ITL, spec counters."""
    before = eng.snapshot().spec_decode or {}
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    t0, c0 = time.perf_counter(), time.process_time()
    ids = [eng.add_request(p, params) for p in prompts]
    finals = {o.request_id: o for o in eng.run_until_done()}
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    outs = [finals[i] for i in ids]
    after = eng.snapshot().spec_decode or {}
    drafted = after.get("num_draft_tokens", 0) - before.get("num_draft_tokens", 0)
    accepted = after.get("num_accepted_tokens", 0) - before.get("num_accepted_tokens", 0)
    drafts = after.get("num_drafts", 0) - before.get("num_drafts", 0)
    tpots = [o.metrics.tpot for o in outs if o.metrics.tpot is not None]
    itls = [g for o in outs for g in o.metrics.itl]
    return {"wall": wall, "cpu": cpu, "tokens": [o.token_ids for o in outs], "num_out": sum(len(o.token_ids) for o in outs),
            "tpot": statistics.median(tpots) if tpots else float("nan"),
            "itl": statistics.median(itls) if itls else float("nan"),
            "acceptance": accepted / drafted if drafted else 0.0,
            "accepted_len": 1 + accepted / drafts if drafts else 0.0}


def copied_fraction(eng: Engine, text: str, output: list[int]) -> float:
    ref = eng.tokenizer.encode(text)
    sm = difflib.SequenceMatcher(None, ref, output, autojunk=False)
    return sum(b.size for b in sm.get_matching_blocks()) / len(ref)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reduced", action="store_true", help="shorter outputs, fewer repeats (a few minutes)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 5, reduced 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    args = ap.parse_args()
    repeats = args.repeats or (3 if args.reduced else 5)
    # the editing output must cover the whole text (~110 tokens) for the copy check, reduced or not
    n_edit, n_chat, n_mixed, n_conc = (110, 48, 24, 32) if args.reduced else (110, 128, 64, 32)
    engines = build_engines(1200, args.threads)
    eng0 = engines["off"]
    edit_prompt = [chat_ids(eng0, EDIT + TEXTS[0])]
    chat_prompt = [chat_ids(eng0, CHATS[0])]
    mixed = [chat_ids(eng0, EDIT + TEXTS[i % len(TEXTS)]) if i % 2 == 0 else chat_ids(eng0, CHATS[i % len(CHATS)])
             for i in range(n_conc)]
    print(f"spec_decode benchmark: {SPEC}, {repeats} interleaved rounds, {args.threads} thread(s), "
          f"load average {os.getloadavg()}")
    for eng in engines.values():   # warm-up (weight packing, allocator), not measured
        run(eng, mixed[:4], 8)
    check = run(eng0, edit_prompt, n_edit)
    frac = copied_fraction(eng0, TEXTS[0], check["tokens"][0])
    print(f"editing workload: the greedy output copies {frac:.0%} of the text (needs >= 80%: "
          f"{'ok' if frac >= 0.8 else 'NOT MET, the workload does not test copying'})")
    workloads = {"edit b=1": (edit_prompt, n_edit), "chat b=1": (chat_prompt, n_chat),
                 f"mixed {n_conc}": (mixed, n_mixed)}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {w: {m: [] for m in MODES} for w in workloads}
    for r in range(repeats):
        for w, (prompts, n) in workloads.items():
            for mode in MODES[r % 3:] + MODES[:r % 3]:   # interleaved, the order rotated each round
                results[w][mode].append(run(engines[mode], prompts, n))
        print(f"  round {r + 1}/{repeats} done, load average {os.getloadavg()}")
    report(results)


TARGETS = {"edit": ("adaptive TPOT >= 2x faster than off", lambda x: x >= 2.0),
           "chat": ("adaptive within 5% of off", lambda x: x >= 0.95),
           "mixed": ("adaptive throughput >= 0.97x off", lambda x: x >= 0.97)}


def report(results: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    identical = total = 0
    for w, by_mode in results.items():
        off = by_mode["off"]
        for mode in ("static", "adaptive"):
            for a, b in zip(off, by_mode[mode]):
                for x, y in zip(a["tokens"], b["tokens"]):
                    total += 1
                    identical += x == y
        med = {m: {k: statistics.median(run[k] for run in runs) for k in ("tpot", "itl", "wall", "acceptance",
                                                                          "accepted_len")}
               | {"tok_s": statistics.median(run["num_out"] / run["wall"] for run in runs),
                  "tok_cpu_s": statistics.median(run["num_out"] / run["cpu"] for run in runs)}
               for m, runs in by_mode.items()}
        if w.startswith("mixed"):
            line = "  ".join(f"{m} {med[m]['tok_s']:.1f} tok/s ({med[m]['tok_s'] / med['off']['tok_s']:.2f}x)"
                             for m in MODES)
            print(f"{w:>10}: throughput  {line}")
            cpu = "  ".join(f"{m} {med[m]['tok_cpu_s']:.1f} ({med[m]['tok_cpu_s'] / med['off']['tok_cpu_s']:.2f}x)"
                            for m in MODES)
            print(f"{'':>10}  per CPU second (less sensitive to neighbours): {cpu}")
            ratio = med["adaptive"]["tok_s"] / med["off"]["tok_s"]
        else:
            line = "  ".join(f"{m} {med[m]['tpot'] * 1e3:.1f} ms ({med['off']['tpot'] / med[m]['tpot']:.2f}x)"
                             for m in MODES)
            print(f"{w:>10}: TPOT        {line}")
            cpu = "  ".join(f"{m} {1e3 / med[m]['tok_cpu_s']:.1f} ms ({med[m]['tok_cpu_s'] / med['off']['tok_cpu_s']:.2f}x)"
                            for m in MODES)
            print(f"{'':>10}  CPU time per output token (prefill included): {cpu}")
            ratio = med["off"]["tpot"] / med["adaptive"]["tpot"]
        what, ok = TARGETS[w.split()[0]]
        print(f"{'':>10}  target: {what}: {ratio:.2f}x {'met' if ok(ratio) else 'NOT met'}"
              + (f"; static {med['static']['tok_s'] / med['off']['tok_s']:.2f}x (its collapse under load)"
                 if w.startswith("mixed") else ""))
        spec = "  ".join(f"{m}: acceptance {med[m]['acceptance']:.0%}, mean accepted length "
                         f"{med[m]['accepted_len']:.2f}, ITL p50 {med[m]['itl'] * 1e3:.1f} ms"
                         for m in ("static", "adaptive"))
        spec += f"  off: ITL p50 {med['off']['itl'] * 1e3:.1f} ms"
        print(f"{'':>10}  {spec}")
    print(f"greedy outputs identical to off: {identical}/{total}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
