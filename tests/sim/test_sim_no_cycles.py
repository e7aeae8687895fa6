"""`simulate` runs with the cycle collector off (its collections found nothing and cost ~5-10% of
a run), which is safe only while a run leaves no cyclic garbage: reference counting must free
everything it drops. Each golden case's configuration (chunked and classic prefill, recompute and
swap preemption, prefix caching on and off, the slo, fair, priority and lpm policies, n-gram
speculation), agent sessions and structured outputs must leave none."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from pacer.config import EngineConfig
from pacer.config.args import engine_kwargs_from_args
from pacer.perf.profiles import get_hardware, get_model
from pacer.request import StructuredOutputsParams
from pacer.sim.cli import build_specs
from pacer.sim.simulator import SimRequest, build_sim_engine, simulate
from pacer.sim.structured import StructuredCost
from tests.sim.test_sim_golden import A100_8B, CASES, _args

AGENTS = [*A100_8B, "--workload", "agent", "--request-rate", "20", "--num-prompts", "40", "--num-kv-blocks", "600"]


@pytest.fixture
def saved_garbage() -> Iterator[list[object]]:
    """What the collector finds unreachable from here on (kept in `gc.garbage`, not freed)."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _found(garbage: list[object]) -> list[str]:
    """The types of what the collector finds unreachable now; the finds are freed after."""
    gc.collect()
    found = sorted({type(o).__name__ for o in garbage})
    garbage.clear()
    gc.set_debug(0)
    gc.collect()   # frees them (cleared from gc.garbage, they are cycles again)
    gc.set_debug(gc.DEBUG_SAVEALL)
    return found


@pytest.mark.parametrize("name", [*sorted(CASES), "agents"])
def test_a_simulation_leaves_no_cyclic_garbage(name: str, saved_garbage: list[object]) -> None:
    args = _args(AGENTS if name == "agents" else CASES[name])
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    engine, executor, clock = build_sim_engine(config, get_hardware(args.hardware), get_model(args.model), tp=args.tp)
    specs, _, _ = build_specs(args, float(args.request_rate), engine.max_model_len)
    _found(saved_garbage)   # the set-up's own (argparse's) is not the run's
    assert gc.isenabled()
    result = simulate(engine, executor, clock, specs)
    assert gc.isenabled()   # restored
    assert _found(saved_garbage) == []   # the engine alive: its radix tree is a cycle once dropped
    assert len(result.records) == len(specs)


def test_a_structured_simulation_leaves_no_cyclic_garbage(saved_garbage: list[object]) -> None:
    schema = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}})
    engine, executor, clock = build_sim_engine(EngineConfig.from_kwargs(), get_hardware("a100-80g"),
                                               get_model("llama-3-8b"), structured_cost=StructuredCost())
    reqs = [SimRequest(f"r{i}", 0.01 * i, list(range(1 + 100 * i, 65 + 100 * i)), 8 + i % 5,
                       structured_outputs=schema if i % 2 else None) for i in range(20)]
    _found(saved_garbage)
    result = simulate(engine, executor, clock, reqs)
    assert _found(saved_garbage) == []
    assert len(result.records) == 20 and executor.mask_rows > 0
