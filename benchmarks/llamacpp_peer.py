"""llama.cpp (llama-cpp-python) on the same GGUF, run in its own venv by offline_throughput.py.

Two measurements, printed as one RESULT line of JSON (every timed run, so the caller reduces
them with the statistic it uses for pacer too):

- `batch1`: one 32-token prompt generates 1 token and then 1 + N tokens, greedy; the
  difference of the two times over N is the decode time per token (the prefill cancels);
- `workload`: a workload JSON ({"prompts": [[ids]], "output_len": N} or "output_lens") run as
  one batch through llama.cpp's own multi-sequence batching (`llama_batch` with a sequence id
  per request, as its `llama-batched` example and server do): every prompt prefilled in
  `--n-batch`-token batches, then one decode batch per step over the sequences still running,
  greedy (argmax of the logits), exactly each request's output length. Token ids in, token ids
  out: no tokenisation is timed.

Built by `../shared/peers/setup.sh llamacpp` (GGML_NATIVE: compiled for this CPU). Threads:
`--threads` for both decode and batch (prefill) work, the same count pacer uses.

    $PEERS_DIR/llamacpp-venv/bin/python benchmarks/llamacpp_peer.py --model model.gguf \
        --threads 2 [--workload w.json] [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from typing import Any


def _api(ll: Any, *names: str) -> Any:
    """The first of `names` this llama_cpp build exports (the C API renamed several calls)."""
    for name in names:
        fn = getattr(ll, name, None)
        if fn is not None:
            return fn
    raise AttributeError(f"llama_cpp has none of {names}")


class Runner:
    """One llama.cpp model and context holding up to `n_seq` sequences of `n_ctx` tokens in all."""

    def __init__(self, path: str, threads: int, n_ctx: int, n_seq: int, n_batch: int) -> None:
        import llama_cpp as ll
        import numpy as np

        self.ll, self.np = ll, np
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        self.model = _api(ll, "llama_model_load_from_file", "llama_load_model_from_file")(path.encode(), mp)
        cp = ll.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, min(n_batch, 512), n_seq
        cp.n_threads = cp.n_threads_batch = threads
        self.ctx = _api(ll, "llama_init_from_model", "llama_new_context_with_model")(self.model, cp)
        vocab = getattr(ll, "llama_model_get_vocab", None)
        self.n_vocab = (ll.llama_vocab_n_tokens(vocab(self.model)) if vocab is not None
                        else ll.llama_n_vocab(self.model))
        self.n_batch = n_batch
        self.batch = ll.llama_batch_init(n_batch, 0, n_seq)

    def clear(self) -> None:
        ll = self.ll
        mem = getattr(ll, "llama_get_memory", None)
        if mem is not None:
            ll.llama_memory_clear(mem(self.ctx), True)
        else:
            _api(ll, "llama_kv_self_clear", "llama_kv_cache_clear")(self.ctx)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> list[int]:
        """Decode (token, position, sequence, wants logits) items in batches of n_batch; the
        greedy next token of each item that wanted logits, in order."""
        ll, b, out = self.ll, self.batch, []
        for start in range(0, len(items), self.n_batch):
            chunk = items[start:start + self.n_batch]
            for i, (tok, pos, seq, logits) in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
                b.seq_id[i][0] = seq
                b.logits[i] = logits
            b.n_tokens = len(chunk)
            rc = ll.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            for i, (_, _, _, logits) in enumerate(chunk):
                if logits:
                    ptr = ll.llama_get_logits_ith(self.ctx, i)
                    row = self.np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                                     shape=(self.n_vocab,))
                    out.append(int(row.argmax()))
        return out

    def generate(self, prompts: list[list[int]], outs: list[int]) -> list[list[int]]:
        """Every prompt as its own sequence, exactly outs[i] greedy tokens each."""
        self.clear()
        items = [(t, p, s, p == len(pr) - 1) for s, pr in enumerate(prompts) for p, t in enumerate(pr)]
        nxt = self._decode(items)
        gen: list[list[int]] = [[t] for t in nxt]
        while True:
            live = [s for s in range(len(prompts)) if len(gen[s]) < outs[s]]
            if not live:
                return gen
            step = [(gen[s][-1], len(prompts[s]) + len(gen[s]) - 1, s, True) for s in live]
            for s, t in zip(live, self._decode(step), strict=True):
                gen[s].append(t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the GGUF file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workload", help="workload JSON (omit: batch-1 decode only)")
    ap.add_argument("--tokens", type=int, default=128, help="batch-1: decode tokens timed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-batch", type=int, default=2048, help="tokens per llama_decode call (pacer's step budget)")
    args = ap.parse_args()
    res: dict[str, Any] = {"engine": "llama.cpp", "threads": args.threads}
    import llama_cpp
    res["version"] = getattr(llama_cpp, "__version__", "?")
    info = llama_cpp.llama_print_system_info().decode(errors="replace")   # the CPU features it was built for
    res["simd"] = " ".join(f.split(" = ")[0].strip() for f in info.split("|") if f.strip().endswith("= 1"))
    if args.workload:
        w = json.load(open(args.workload))
        prompts = w["prompts"]
        outs = w.get("output_lens") or [w["output_len"]] * len(prompts)
        n_ctx = sum(len(p) + o for p, o in zip(prompts, outs, strict=True)) + 64
        r = Runner(args.model, args.threads, n_ctx, len(prompts), args.n_batch)
        r.generate([list(range(100, 164))], [4])   # warm-up
        runs = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            gen = r.generate(prompts, outs)
            runs.append(time.perf_counter() - t)
            assert [len(g) for g in gen] == outs
        res.update(runs_s=runs, output_tokens=sum(outs), first_output_ids=[g[:16] for g in gen[:4]])
    r1 = Runner(args.model, args.threads, 2048, 1, 512)
    prompt = [list(range(200, 232))]

    def times(n: int) -> list[float]:
        runs = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            assert len(r1.generate(prompt, [n])[0]) == n
            runs.append(time.perf_counter() - t)
        return runs

    times(4)   # warm-up
    res.update(tokens=args.tokens, runs_one_s=times(1), runs_many_s=times(1 + args.tokens))
    print("RESULT", json.dumps(res))


if __name__ == "__main__":
    main()
