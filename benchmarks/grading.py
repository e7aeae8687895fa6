"""Grade pacer the way users grade engines: EleutherAI's lm-evaluation-harness runs two local
tasks made here from the sentences pacer ships (`pacer.corpus`; no hub download), a
multiple-choice one scored by loglikelihood and a `generate_until` one scored by exact match of
greedy generations, through `lm_eval --model local-completions` against `pacer serve` under each
numerics setting (float32, bfloat16, int8 / fp8 KV, n-gram speculation), and through
`lm_eval --model hf` on the same weights in float32. Prints accuracy, the per-item
loglikelihood difference against HF float32, exact match and the generations that differ from
HF's as a table.

Needs the peers (`PEERS_DIR=/tmp/pacer-peers bash /work/shared/peers/setup.sh lmeval` and `hf`):
    PYTHONPATH=src python benchmarks/grading.py [--items 72] [--configs float32,bfloat16,int8,fp8,spec]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pacer.corpus import CORPUS

PEERS = Path(os.environ.get("PEERS_DIR", "/tmp/pacer-peers"))
LM_EVAL = PEERS / "lmeval-venv" / "bin" / "lm_eval"
HF_DIR = PEERS / "smollm2-hf"
TASK = "pacer_corpus_mc"
GEN_TASK = "pacer_corpus_gen"
CONFIGS: dict[str, list[str]] = {
    "float32": ["--dtype", "float32"],
    "bfloat16": ["--dtype", "bfloat16"],
    "int8": ["--dtype", "float32", "--kv-cache-dtype", "int8"],
    "fp8": ["--dtype", "float32", "--kv-cache-dtype", "fp8"],
    "spec": ["--dtype", "float32", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
}


def write_task(folder: Path, num_items: int) -> Path:
    """A 4-way sentence-completion task: each shipped sentence cut in half; the choices are its
    own second half and three other sentences' (fixed offsets), the answer at index i % 4."""
    sentences = [s.split() for s in CORPUS][:max(4, num_items)]
    n = len(sentences)
    rows = []
    for i, words in enumerate(sentences):
        cut = len(words) // 2
        others = [sentences[(i + d) % n] for d in (17, 31, 47)]
        endings = [" ".join(w[len(w) // 2:]) for w in others]
        label = i % 4
        endings.insert(label, " ".join(words[cut:]))
        rows.append({"context": " ".join(words[:cut]), "choices": endings, "label": label})
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{TASK}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: label\ntarget_delimiter: \" \"\n"
        "metric_list:\n  - metric: acc\n")
    _write_gen_task(folder, list(CORPUS)[:max(4, num_items)])
    return folder


def _write_gen_task(folder: Path, sentences: list[str]) -> None:
    """A `generate_until` task: a sentence, a line break, its first half again; the target is its
    second half (a model that copies scores; greedy, so HF and pacer must write the same text)."""
    rows = []
    for s in sentences:
        words = s.split()
        cut = len(words) // 2
        rows.append({"context": f"{s}\n{' '.join(words[:cut])}", "target": " ".join(words[cut:])})
    data = folder / f"{GEN_TASK}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{GEN_TASK}.yaml").write_text(
        f"task: {GEN_TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_target: \"{{target}}\"\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  do_sample: false\n  max_gen_toks: 32\n"
        "metric_list:\n  - metric: exact_match\n    regexes_to_ignore: [\"^\\\\s+\", \"\\\\s+$\"]\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(flags: list[str], log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "pacer.cli", "serve", "--port", str(port), "--served-model-name", "smollm2",
           "--num-threads", "2", *flags]
    proc = subprocess.Popen(cmd, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pacer serve exited ({proc.returncode}); see {log_path}")
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.5)   # a subprocess's start-up, not a test: polling its port is the only signal
    proc.kill()
    raise RuntimeError(f"pacer serve did not come up in 600 s; see {log_path}")


def run_lm_eval(model: str, model_args: str, task_dir: Path, out_dir: Path, extra: list[str] = ()) -> dict:
    """Runs lm_eval on both tasks; returns {"acc": .., "ll": {doc_id: [loglikelihood per
    choice]}, "n": .., "gen": {"em": .., "text": {doc_id: generation}, "n": ..}}."""
    cmd = [str(LM_EVAL), "--model", model, "--model_args", model_args, "--tasks", f"{TASK},{GEN_TASK}",
           "--include_path", str(task_dir), "--log_samples", "--output_path", str(out_dir), *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=(out_dir.parent / f"{out_dir.name}.log").open("wb"))
    mc, gen = _samples(out_dir, TASK), _samples(out_dir, GEN_TASK)
    ll = {int(d["doc_id"]): [float(r[0]) for r in d["filtered_resps"]] for d in mc}
    texts = {int(d["doc_id"]): str(d["filtered_resps"][0]) for d in gen}
    return {"acc": sum(float(d["acc"]) for d in mc) / len(mc), "ll": ll, "n": len(mc),
            "gen": {"em": sum(float(d["exact_match"]) for d in gen) / len(gen), "text": texts, "n": len(gen)}}


def _samples(out_dir: Path, task: str) -> list[dict]:
    found = glob.glob(str(out_dir / "**" / f"samples_{task}_*.jsonl"), recursive=True)
    if not found:
        raise RuntimeError(f"lm_eval wrote no samples of {task} under {out_dir}")
    return [json.loads(line) for line in Path(found[0]).read_text().splitlines()]


def differing_generations(ref: dict, got: dict) -> int:
    """Items of the generation task whose text differs from the reference's."""
    return sum(got["gen"]["text"].get(d) != t for d, t in ref["gen"]["text"].items())


def grade_served(flags: list[str], task_dir: Path, work: Path, name: str) -> dict:
    proc, url = start_server(flags, work / f"serve-{name}.log")
    try:
        args = (f"model=smollm2,base_url={url}/v1/completions,tokenizer={HF_DIR},tokenized_requests=True,"
                "num_concurrent=4,max_retries=3,timeout=600")
        return run_lm_eval("local-completions", args, task_dir, work / f"out-{name}")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def grade_hf(task_dir: Path, work: Path) -> dict:
    return run_lm_eval("hf", f"pretrained={HF_DIR},dtype=float32", task_dir, work / "out-hf",
                       ["--device", "cpu", "--batch_size", "8"])


def compare(ref: dict, got: dict) -> tuple[float, float, int]:
    """(mean and max |per-choice loglikelihood difference|, items whose chosen answer differs)."""
    diffs = [abs(a - b) for d in ref["ll"] for a, b in zip(ref["ll"][d], got["ll"][d])]
    flips = sum(max(range(len(v)), key=v.__getitem__) != max(range(len(got["ll"][d])), key=got["ll"][d].__getitem__)
                for d, v in ref["ll"].items())
    return sum(diffs) / len(diffs), max(diffs), flips


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=len(CORPUS), help="task items (at most the shipped sentences)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="pacer settings to grade, comma-separated")
    args = ap.parse_args()
    for need in (LM_EVAL, HF_DIR / "config.json"):
        if not need.exists():
            sys.exit(f"missing {need}: run PEERS_DIR={PEERS} bash /work/shared/peers/setup.sh lmeval (and hf)")
    flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0]
    cpu = " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags)
    work = Path(tempfile.mkdtemp(prefix="pacer-grading-"))
    task_dir = write_task(work / "task", args.items)
    t0 = time.monotonic()
    ref = grade_hf(task_dir, work)
    print(f"# {ref['n']} items, task {TASK} from pacer.corpus; cpu flags: {cpu}; load {os.getloadavg()[0]:.2f}")
    print("| engine | accuracy | mean abs dLL vs HF fp32 | max abs dLL | answers changed | exact match (gen) "
          "| generations differing |")
    print("|---|---|---|---|---|---|---|")
    print(f"| lm_eval --model hf, float32 | {ref['acc']:.3f} | 0 | 0 | 0 | {ref['gen']['em']:.3f} | 0 |")
    for name in args.configs.split(","):
        got = grade_served(CONFIGS[name], task_dir, work, name)
        mean, worst, flips = compare(ref, got)
        print(f"| pacer {name} ({' '.join(CONFIGS[name])}) | {got['acc']:.3f} | {mean:.2e} | {worst:.2e} | {flips} "
              f"| {got['gen']['em']:.3f} | {differing_generations(ref, got)} |", flush=True)
    print(f"# {time.monotonic() - t0:.0f} s, load average {os.getloadavg()[0]:.2f}; work dir {work}")


if __name__ == "__main__":
    main()
