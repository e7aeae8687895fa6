"""The in-process driver on an engine with a fake executor (no model): arrivals, the closed
loop's concurrency, duration, errors, and records consistent with the engine's metrics."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.workload.arrivals import ClosedLoop, Poisson
from pacer.workload.generator import generate_requests, iter_requests
from pacer.workload.report import OVERALL, STATUS_ERROR, build_report
from pacer.workload.runner import run_inprocess
from pacer.workload.spec import builtin_workload
from tests.fakes import FakeExecutor


def _engine(max_model_len: int = 512) -> Engine:
    config = EngineConfig.from_kwargs(max_num_batched_tokens=64, max_num_seqs=8)
    fake = FakeExecutor(block_size=16)
    engine = Engine(config, fake, tokenizer=None, num_kv_blocks=128, model_max_len=max_model_len)
    fake.scheduler = engine.scheduler
    return engine


def test_open_loop_records_match_specs() -> None:
    specs = generate_requests(builtin_workload("chat"), Poisson(math.inf), seed=2, num_requests=12,
                              max_model_len=512)
    records, t0, stats = run_inprocess(specs, _engine())
    assert [r.request_id for r in records] == [s.request_id for s in specs]
    for rec, spec in zip(records, specs):
        assert rec.ok and rec.output_tokens == spec.output_tokens and rec.prompt_tokens == spec.prompt_tokens
        assert rec.request_class == spec.request_class and rec.session == spec.session
        assert rec.arrival_time == pytest.approx(0.0, abs=1e-9)   # at its scheduled time, relative to t0
        assert rec.queue_wait is not None and rec.ttft is not None and rec.ttft >= rec.queue_wait >= 0
        assert len(rec.itl) == spec.output_tokens - 1
    assert stats.num_steps > 0 and stats.num_decode_tokens > 0
    assert build_report(records).summary[OVERALL]["num_ok"] == 12


def test_closed_loop_caps_requests_in_flight() -> None:
    engine = _engine()
    seen: list[int] = []
    engine.stats_listeners.append(lambda s: seen.append(s.num_running + s.num_waiting))
    specs = generate_requests(builtin_workload("fixed", 20, 5), ClosedLoop(3), num_requests=9)
    records, _, _ = run_inprocess(specs, engine, closed_loop=True, concurrency=3)
    assert len(records) == 9 and all(r.ok for r in records)
    assert max(seen) <= 3


def test_duration_stops_an_endless_closed_loop() -> None:
    specs = iter_requests(builtin_workload("fixed", 20, 5), ClosedLoop(2))
    records, _, _ = run_inprocess(specs, _engine(), closed_loop=True, concurrency=2, duration=0.2)
    assert records and all(r.ok for r in records)
    assert all(r.arrival_time <= 0.2 + 1e-3 for r in records)


def test_refused_request_is_an_error_record() -> None:
    specs = generate_requests(builtin_workload("fixed", 20, 5), Poisson(math.inf), num_requests=2)
    specs[1] = dataclasses.replace(specs[1], output_tokens=5000)   # beyond max_model_len
    records, _, _ = run_inprocess(specs, _engine())
    assert records[0].ok and records[1].status == STATUS_ERROR and "max_model_len" in (records[1].error or "")
