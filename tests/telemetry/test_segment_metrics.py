"""The segment store's /metrics series (`SegmentReuseCollector`, which `pacer serve` registers):
gauges of the segments and blocks it holds, counters of segments stored, evicted, demoted to the
host tier and promoted back, fills (hits), reused and recomputed tokens, read from the engine snapshot; absent while segment reuse is off."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from pacer.request import SamplingParams
from pacer.telemetry.collectors import SegmentReuseCollector
from tests.fakes import make_engine


def _series(engine) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(SegmentReuseCollector(engine.snapshot, lambda base: f"vllm:{base}", "m"))
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("vllm:") and '{model_name="m"}' in line:
            name, value = line.split('{model_name="m"} ')
            out[name.removeprefix("vllm:")] = float(value)
    return out


def _run(engine, prompt, spans) -> None:
    engine.add_request(prompt, SamplingParams(max_tokens=1), segments=spans)
    while engine.has_unfinished_requests():
        engine.step()
        engine.kv.check_invariants()


def test_the_store_series_count_stores_hits_tokens_and_evictions() -> None:
    eng, _ = make_engine(num_blocks=24, block_size=4, max_len=80, segment_reuse="approximate",
                         segment_recompute=0.25)
    seg_a, seg_b = list(range(500, 532)), list(range(600, 632))        # 32 tokens: 8 blocks each
    histories = [list(range(100 + 10 * i, 108 + 10 * i)) for i in range(4)]
    assert _series(eng)["segment_store_segments"] == 0
    _run(eng, histories[0] + seg_a + [7], [(8, 32)])                  # stores A
    _run(eng, histories[1] + seg_a + [7], [(8, 32)])                  # reuses A: 8 recomputed, 24 filled
    got = _series(eng)
    assert got["segment_store_segments"] == 1 and got["segment_store_blocks"] == 8
    assert got["segment_store_stored_total"] == 1 and got["segment_reuse_hits_total"] == 1
    assert got["segment_reuse_reused_tokens_total"] == 24 and got["segment_reuse_recomputed_tokens_total"] == 8
    assert got["segment_store_evictions_total"] == 0
    _run(eng, list(range(300, 372)), None)                            # 18 blocks: only with A's 8 evicted
    got = _series(eng)
    assert got["segment_store_evictions_total"] == 1
    assert got["segment_store_segments"] == 0 and got["segment_store_blocks"] == 0
    _run(eng, histories[2] + seg_b + [7], [(8, 32)])                  # stores B
    _run(eng, histories[3] + seg_b + [7], [(8, 32)])                  # reuses B
    got = _series(eng)
    assert got["segment_store_stored_total"] == 2 and got["segment_reuse_hits_total"] == 2
    assert got["segment_store_segments"] == 1
    snap = eng.snapshot().as_dict()["segments"]
    assert snap["reused_tokens"] == 48 and snap["evicted"] == 1


def test_the_host_tier_series_count_demotions_and_promotions() -> None:
    eng, _ = make_engine(num_blocks=24, block_size=4, max_len=80, segment_reuse="approximate",
                         segment_recompute=0.25, kv_offloading_size=1.0, num_cpu_blocks=32)
    seg = list(range(500, 532))
    _run(eng, list(range(100, 108)) + seg + [7], [(8, 32)])             # stores it (its save runs next step)
    _run(eng, [900, 901, 902], None)                                  # that step: the store holds its KV
    _run(eng, list(range(300, 372)), None)                            # evicts it: demoted
    got = _series(eng)
    assert got["segment_store_demotions_total"] == 1 and got["segment_store_promotions_total"] == 0
    _run(eng, list(range(110, 118)) + seg + [7], [(8, 32)])             # promoted back, then filled from
    got = _series(eng)
    assert got["segment_store_promotions_total"] == 1 and got["segment_reuse_hits_total"] == 1
    assert got["segment_store_stored_total"] == 1 and got["segment_store_segments"] == 1


def test_no_series_while_segment_reuse_is_off() -> None:
    eng, _ = make_engine(num_blocks=24, block_size=4, max_len=64)
    _run(eng, list(range(100, 141)), [(8, 32)])
    assert _series(eng) == {} and eng.snapshot().segments == {}
