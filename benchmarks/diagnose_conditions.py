"""Evidence for `pacer diagnose`: four provoked conditions on the real engine, each diagnosed.

Runs four short workloads through an in-process engine with the default model (`pacer bench
--engine inprocess`, one torch thread), saves each run file, and prints what `pacer diagnose`
names for it:

- queue: overload, chats at 6 req/s with --max-num-seqs 4;
- prefill: ~1,800-token prompts among short chats (1 req/s);
- decode: a large token budget (8192) under many decodes (--max-num-seqs 64, 2 req/s);
- preemption: a KV budget too small (--kv-cache-memory 48MiB) for 256+256-token requests.

    .venv/bin/python benchmarks/diagnose_conditions.py [--out DIR] [--only queue,prefill]

Times depend on the machine and its load (printed); nothing here asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

from pacer.cli.main import main

WORKLOADS = {
    "prefill": "classes:\n  - {name: chat, weight: 3, prompt_len: {mean: 96, cv: 0.3}, output_len: 64}\n"
               "  - {name: long, weight: 1, prompt_len: {mean: 1800, cv: 0.1}, output_len: 16}\n",
    "decode": "classes:\n  - {name: chat, weight: 1, prompt_len: {mean: 160, cv: 0.2}, output_len: 192}\n",
    "preemption": "classes:\n  - {name: chat, weight: 1, prompt_len: {mean: 256, cv: 0.2}, output_len: 256}\n",
}
FLAGS = {
    "queue": ["--workload", "chat", "--request-rate", "6", "--num-prompts", "40", "--max-num-seqs", "4"],
    "prefill": ["--request-rate", "1", "--num-prompts", "24"],
    "decode": ["--request-rate", "2", "--num-prompts", "30", "--max-num-seqs", "64", "--max-num-batched-tokens", "8192"],
    "preemption": ["--request-rate", "2", "--num-prompts", "16", "--kv-cache-memory", "48MiB"],
}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_condition(name: str, out: Path) -> dict[str, str]:
    flags = list(FLAGS[name])
    if name in WORKLOADS:
        spec = out / f"{name}.yaml"
        spec.write_text(WORKLOADS[name])
        flags = ["--workload", str(spec), *flags]
    path = out / f"{name}.json"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["bench", "--engine", "inprocess", "--num-threads", "1", *flags, "--out", str(path)])
    if rc:
        raise SystemExit(f"{name}: pacer bench failed ({rc})")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["diagnose", str(path), "--json"])
    d = json.loads(buf.getvalue())
    return {"overall": d["overall"]["bottleneck"], **{k: v["bottleneck"] for k, v in d["classes"].items()}}


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="keep the run files here (default: a temporary directory)")
    ap.add_argument("--only", default=",".join(FLAGS), help="comma list of conditions")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="pacer-diagnose-"))
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        print(f"[{name}] load average {load()} ...", flush=True)
        named = run_condition(name, out)
        verdict = "named" if named["overall"] == name else "NOT named"
        print(f"[{name}] pacer diagnose {out / (name + '.json')}: {json.dumps(named)} -> cause {verdict}; "
              f"load average {load()}", flush=True)


if __name__ == "__main__":
    main_()
