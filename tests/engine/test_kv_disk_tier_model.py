"""The disk KV tier on the real model (SmolLM2-135M): blocks demoted to the host tier are
written through, a graceful shutdown writes the rest, a restarted engine's first request
hits them (promoted from the host tier it read them into) with the outputs of recompute;
files of another KV dtype, or a corrupt one, are refused without crashing."""

from __future__ import annotations

from pathlib import Path

import pytest

from pacer.engine import Engine
from pacer.kv.tiers.disk import DiskTier
from pacer.request import SamplingParams
from pacer.telemetry.request_log import make_log_record
from tests.conftest import make
from tests.engine.test_prefix_cache_model import QUESTIONS, chat_ids, generate

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
KW = dict(num_kv_blocks=8, block_size=8, kv_offloading_size=1.0, num_cpu_blocks=64)


def _engine(base: Engine, directory: Path, **kw: object) -> tuple[Engine, DiskTier]:
    """An engine with kv_offloading_dir: its one KV tier hook is the disk tier, opened (its files
    read back) as the engine was built."""
    engine = make(base, **{**KW, "kv_offloading_dir": str(directory), **kw})
    (disk,) = engine.tiers
    assert isinstance(disk, DiskTier)
    return engine, disk


def test_a_restarted_engine_hits_what_it_had_cached_and_refuses_foreign_files(base: Engine, tmp_path: Path) -> None:
    prompts = [chat_ids(base, q, system=f"Shop {i} of {name}: you answer questions about it. Be brief.")
               for i, (q, name) in enumerate(zip(QUESTIONS, ["Anna", "Ben", "Cleo"]))]
    first, disk = _engine(base, tmp_path)
    want = [generate(first, [p], PARAMS)[0] for p in prompts]   # each evicts (demotes) the one before
    assert first.kv.host_tier is not None and first.kv.host_tier.stats.demotions > 0
    assert disk.index.stats.written > 0                         # written through, before any shutdown
    through = disk.index.stats.written
    first.shutdown()                                            # and the device tree's blocks
    assert disk.index.stats.written > through
    files = sorted(tmp_path.glob("*.kvblock"))

    second, disk2 = _engine(base, tmp_path)
    assert disk2.index.stats.loaded == len(files) and disk2.index.stats.refused == 0
    got = generate(second, [prompts[-1]], PARAMS)[0]            # the first request after the restart
    assert got.num_cached_tokens >= 8 * ((len(prompts[-1]) - 1) // 8) - 8
    assert got.token_ids == want[-1].token_ids
    assert got.metrics.cached_tokens_host == got.num_cached_tokens   # all promoted: the request log's split
    record = make_log_record(metrics=got.metrics, start=0.0, clock_to_unix=0.0)
    assert (record["cached_tokens_device"], record["cached_tokens_host"]) == (0, got.num_cached_tokens)
    tiers = second.snapshot().tiers
    assert tiers["host"]["promotions"] > 0 and tiers["device"]["hit_tokens"] == 0
    second.kv.check_invariants()
    assert tiers["disk"]["promotions"] == len(files) and tiers["disk"]["blocks"] == len(files)
    _check_tier_series(second, tiers)

    other, disk3 = _engine(base, tmp_path, kv_cache_dtype="int8")   # another KV dtype: nothing loads
    assert disk3.index.stats.loaded == 0 and disk3.index.stats.refused == len(files)
    assert "kv_cache_dtype='auto' (this engine: 'int8')" in disk3.index.stats.refusals[0]
    assert generate(other, [prompts[-1]], PARAMS)[0].num_cached_tokens == 0
    other.shutdown()                                            # its own files; the others' untouched
    assert all(f.read_bytes() for f in files)

    files[0].write_bytes(files[0].read_bytes()[:-5] + b"xxxxx")     # corrupt one file
    fourth, disk4 = _engine(base, tmp_path)
    assert disk4.index.stats.refused == 1 + disk3.index.stats.written
    assert any("checksum" in r for r in disk4.index.stats.refusals)
    assert generate(fourth, [prompts[0]], PARAMS)[0].token_ids == want[0].token_ids
    fourth.kv.check_invariants()


def _check_tier_series(engine: Engine, tiers: dict) -> None:
    """/metrics' tier series (the collector `pacer serve` registers) carry the same figures."""
    from prometheus_client import CollectorRegistry, generate_latest

    from pacer.telemetry.collectors import KVTierCollector

    registry = CollectorRegistry()
    registry.register(KVTierCollector(engine.snapshot, lambda base: f"vllm:{base}", "m"))
    text = generate_latest(registry).decode()
    host_hits = f'vllm:kv_tier_hit_tokens_total{{model_name="m",tier="host"}} {float(tiers["host"]["hit_tokens"])}'
    assert host_hits in text and tiers["host"]["hit_tokens"] > 0
    assert f'vllm:kv_tier_promotions_total{{model_name="m",tier="disk"}} {float(tiers["disk"]["promotions"])}' in text
    assert 'vllm:kv_tier_bytes_total{direction="out",model_name="m",tier="host"}' in text
    assert 'vllm:kv_tier_usage_perc{model_name="m",tier="device"}' in text


@pytest.mark.slow
def test_llm_with_kv_offloading_dir_hits_after_a_restart(tmp_path: Path) -> None:
    """The public path: `with LLM(kv_offloading_dir=...)` writes at close, a new LLM hits."""
    from pacer.llm import LLM

    kw = dict(num_threads=1, num_kv_blocks=64, kv_offloading_size=1.0, num_cpu_blocks=64,
              kv_offloading_dir=str(tmp_path))
    prompt = "The harbour master wrote down every boat that came in, its name and its cargo. " * 4
    params = SamplingParams(max_tokens=4, temperature=0.0)
    with LLM(**kw) as llm:
        first = llm.generate(prompt, params)[0]
    assert list(tmp_path.glob("*.kvblock"))
    with LLM(**kw) as llm:
        again = llm.generate(prompt, params)[0]
        assert again.num_cached_tokens > 0 and llm.engine.snapshot().tiers["host"]["promotions"] > 0
    assert again.token_ids == first.token_ids
