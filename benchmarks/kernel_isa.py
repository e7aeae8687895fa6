"""The C++ kernels at each ISA level this CPU runs (issue 26: kernels that dispatch at run time),
side by side in one run on the default model's shapes (SmolLM2-135M: 9 query heads, 3 KV heads,
head size 64, hidden 576, intermediate 1536), against the torch reference path.

Run: PYTHONPATH=src python benchmarks/kernel_isa.py [--repeats 20] [--threads N]
Prints, per op and level, the median time and its ratio to the level `load()` picks here. The
`decode attn 30L` rows are a decode step's attention over all 30 layers' caches (read from memory,
as in the engine); the other rows repeat one small call whose data stays in the CPU's caches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from pacer.model import kernels
from pacer.model.attention import AttentionMetadata, PrefillSeq, paged_attention

NH, NKV, D, HIDDEN, INTER, BS = 9, 3, 64, 576, 1536, 16


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _decode_case(rows: int, ctx: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    width = -(-ctx // BS)
    kc = torch.randn(rows * width + 1, BS, NKV, D, generator=g)
    vc = torch.randn_like(kc)
    tables = torch.randperm(rows * width, generator=g).view(rows, width).contiguous()
    return {"q": torch.randn(rows, NH, D, generator=g), "kc": kc, "vc": vc, "tables": tables,
            "ctx": torch.full((rows,), ctx, dtype=torch.long)}


def _prefill_fn(K: Any, n: int) -> Callable[[], object]:
    """One causal prefill of `n` tokens from position 0, its KV already in shuffled blocks."""
    g = torch.Generator().manual_seed(2)
    width = -(-n // BS)
    kc = torch.randn(width + 1, BS, NKV, D, generator=g)
    vc = torch.randn_like(kc)
    table = torch.randperm(width, generator=g)
    q, k, v = torch.randn(n, NH, D, generator=g), torch.randn(n, NKV, D, generator=g), torch.randn(n, NKV, D, generator=g)
    if K is None:
        slots = torch.tensor([int(table[p // BS]) * BS + p % BS for p in range(n)])
        meta = AttentionMetadata(slot_mapping=slots, num_single=0, single_block_tables=None, single_mask=None,
                                 single_context_lens=None, prefills=[PrefillSeq(0, n, 0, table)])
        return lambda: paged_attention(q, k, v, kc, vc, meta, 0.125, kernel=None)
    o = torch.empty_like(q)
    args = (torch.tensor([0]), torch.tensor([n]), torch.tensor([0]), table.unsqueeze(0).contiguous())
    return lambda: K.paged_prefill_attention(o, q, kc, vc, *args, 0.125, 1.0, 1.0)


LAYERS = 30   # the default model's: a decode step reads every layer's cache once


def _layers_cases(rows: int, ctx: int) -> list[dict[str, object]]:
    """LAYERS caches of `rows` x `ctx` tokens (32 x 1500 over 30 layers: 2.2 GB), so each call reads
    from memory, as a step does, not from the cache a single layer's repeats warm."""
    return [_decode_case(rows, ctx) for _ in range(LAYERS)]


def _decode_layers_fn(K: Any, cases: list[dict[str, object]]) -> Callable[[], object]:
    o = torch.empty_like(cases[0]["q"])
    return lambda: [K.paged_decode_attention(o, c["q"], c["kc"], c["vc"], c["tables"], c["ctx"], 0.125, 1.0, 1.0)
                    for c in cases]


def ops(K: Any, repeats: int, layer_cases: dict[str, list[dict[str, object]]]) -> dict[str, float]:
    """Median ms per op with module K (None: the torch reference path); `layer_cases`: the
    decode step's attention over every layer, C++ levels only (the torch path would take minutes)."""
    out: dict[str, float] = {}
    if K is not None:
        for name, cases in layer_cases.items():
            out[name] = _median_ms(_decode_layers_fn(K, cases), max(3, repeats // 4))
    for rows, ctx in ((1, 512), (32, 512)):
        c = _decode_case(rows, ctx)
        o = torch.empty_like(c["q"])
        if K is None:
            mask = (torch.arange(c["tables"].shape[1] * BS).unsqueeze(0) < c["ctx"].unsqueeze(1))[:, None, None, :]
            meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), num_single=rows,
                                     single_block_tables=c["tables"], single_mask=mask, single_context_lens=c["ctx"],
                                     prefills=[])
            empty = torch.empty(0, NKV, D)
            fn = lambda c=c, meta=meta, empty=empty: paged_attention(c["q"], empty, empty, c["kc"], c["vc"], meta, 0.125,  # noqa: E731
                                                                     kernel=None)
        else:
            fn = lambda c=c, o=o: K.paged_decode_attention(o, c["q"], c["kc"], c["vc"], c["tables"], c["ctx"],  # noqa: E731
                                                           0.125, 1.0, 1.0)
        out[f"decode attention {rows}x{ctx}"] = _median_ms(fn, repeats)
    out["prefill attention 512"] = _median_ms(_prefill_fn(K, 512), repeats)
    g = torch.Generator().manual_seed(1)
    gate_up = torch.randn(256, 2 * INTER, generator=g)
    x, delta, w = torch.randn(256, HIDDEN, generator=g), torch.randn(256, HIDDEN, generator=g), torch.rand(HIDDEN)
    if K is None:
        out["silu_and_mul 256"] = _median_ms(lambda: F.silu(gate_up[:, :INTER]) * gate_up[:, INTER:], repeats)
        out["add_rms_norm 256"] = _median_ms(lambda: F.rms_norm(x + delta, (HIDDEN,), w, 1e-5), repeats)
    else:
        out["silu_and_mul 256"] = _median_ms(lambda: K.silu_and_mul(gate_up), repeats)
        out["add_rms_norm 256"] = _median_ms(lambda: K.add_rms_norm_(x.clone(), delta, w, 1e-5), repeats)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    flags = kernels.cpu_flags()
    shown = ",".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile")
                     if f in flags)
    print(f"kernel_isa  cpu flags {shown or 'none'}  levels {', '.join(kernels.supported_isas())}  "
          f"default {kernels.kernel_isa()}  threads {args.threads}  load {'/'.join(f'{v:.1f}' for v in os.getloadavg())}")
    levels = kernels.supported_isas()
    layer_cases = {f"decode attn {LAYERS}L {r}x{c}": _layers_cases(r, c) for r, c in ((1, 1500), (32, 1500))}
    results = {"torch": ops(None, args.repeats, layer_cases)}
    for isa in levels:   # interleaved twice, the second pass kept (the first warms caches and clocks)
        results[isa] = ops(kernels.load(isa), args.repeats, layer_cases)
    for isa in levels:
        results[isa] = ops(kernels.load(isa), args.repeats, layer_cases)
    base = kernels.kernel_isa()
    names = list(results[base])
    print(f"{'op':<28}" + "".join(f"{lvl:>22}" for lvl in results))
    for name in names:
        row = f"{name:<28}"
        for lvl in results:
            ms = results[lvl].get(name)
            row += f"{'-':>22}" if ms is None else f"{ms:>10.3f} ms ({results[base][name] / ms:4.2f}x)"
        print(row)
    print(f"ratios: the {base} level's time / the column's (above 1: the column is faster)  "
          f"load {'/'.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
