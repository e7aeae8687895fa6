"""SLO specs, per-request targets and the one class vocabulary (pacer.config.slo)."""

from __future__ import annotations

import pytest

from pacer.config import EngineConfig
from pacer.config.slo import ClassRules, Slo, parse_slo, slo_from_request
from pacer.workload.arrivals import make_arrivals
from pacer.workload.generator import generate_requests
from pacer.workload.spec import BUILTIN_WORKLOADS


def test_parse_slo_default_and_classes_with_alias() -> None:
    s = parse_slo(["ttft=300ms,itl=50ms", "long_context:ttft=2s", "batch:e2e=60s"])
    assert s.for_class("chat") == Slo(ttft=0.3, itl=0.05)
    assert s.for_class("rag") == Slo(ttft=2.0, itl=0.05)          # long_context is rag's alias
    assert s.for_class("long_context") == s.for_class("rag")
    assert s.for_class("batch") == Slo(ttft=0.3, itl=0.05, e2e=60.0)


@pytest.mark.parametrize(("spec", "words"), [
    (["latency=3s"], ("unknown key", "latency")),
    (["ttft=0ms"], ("slo ttft", "> 0")),
    (["itl=-5ms"], ("slo itl", "> 0")),
    (["tpot=fast"], ("slo tpot", "duration")),
    (["video:ttft=1s"], ("unknown class", "video", "chat")),
])
def test_bad_slo_specs_name_the_field(spec: list[str], words: tuple[str, ...]) -> None:
    with pytest.raises(ValueError) as e:
        parse_slo(spec)
    for w in words:
        assert w in str(e.value)


def test_engine_config_validates_slo_specs() -> None:
    assert EngineConfig.from_kwargs(slo=["rag:ttft=2s"]).scheduler.slo == ("rag:ttft=2s",)
    with pytest.raises(ValueError, match="unknown class 'video'"):
        EngineConfig.from_kwargs(slo=["video:ttft=1s"])
    with pytest.raises(ValueError, match="max_queue_delay"):
        EngineConfig.from_kwargs(max_queue_delay=0)


def test_request_targets_merge_and_the_tighter_knob() -> None:
    own = slo_from_request({"ttft_ms": 100, "tpot_ms": 20})
    assert own == Slo(ttft=0.1, tpot=0.02) and own.itl_target == 0.02   # tpot stands for itl
    cls = Slo(ttft=0.3, itl=0.05)
    assert cls.merged(own) == Slo(ttft=0.1, itl=0.05, tpot=0.02)
    assert cls.merged(own, allow_tighter=False).ttft == 0.3
    with pytest.raises(ValueError, match="slo: unknown key 'ttft'"):
        slo_from_request({"ttft": 100})
    with pytest.raises(ValueError, match=r"slo.itl_ms must be a number of milliseconds > 0"):
        slo_from_request({"itl_ms": 0})


def test_met_by_checks_each_target() -> None:
    class R:
        ttft, tpot, e2e, itl = 0.2, 0.03, 5.0, [0.03, 0.04, 0.06]

    assert Slo(ttft=0.3, tpot=0.05).met_by(R())
    assert not Slo(itl=0.05).met_by(R())          # p99 of its own gaps is ~0.06
    assert not Slo(ttft=0.3).met_by(R(), ok=False)


def test_bench_workloads_classify_as_themselves() -> None:
    rules = ClassRules()
    specs = generate_requests(BUILTIN_WORKLOADS["mixed"], make_arrivals(10.0, 1.0, None), seed=1, num_requests=200)
    declared = [rules.classify(s.prompt_tokens, s.output_tokens, False, declared=s.request_class) for s in specs]
    assert declared == [s.request_class for s in specs]
    # without a declared class, lengths alone put most rag prompts in rag and batch in batch
    by_len = {c: [rules.classify(s.prompt_tokens, s.output_tokens, s.request_class == "agent") == c
                  for s in specs if s.request_class == c] for c in ("rag", "batch", "agent")}
    for c, hits in by_len.items():
        assert sum(hits) / len(hits) >= 0.75, c
    assert rules.classify(3000, 16, False) == "rag"
    assert rules.classify(10, 16, False, declared="long_context") == "rag"
    with pytest.raises(ValueError, match="request class 'video'"):
        rules.classify(10, 16, False, declared="video")
