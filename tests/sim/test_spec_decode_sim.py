"""The simulator prices verification tokens with its cost model and accepts drafts at a set rate."""

from pacer.config import EngineConfig
from pacer.perf.profiles import get_hardware, get_model
from pacer.sim.simulator import SimRequest, build_sim_engine, simulate

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def test_simulator_prices_drafts_and_models_the_acceptance_rate():
    results = {}
    for spec in (None, {**NGRAM, "acceptance_rate": 0.7}):
        kw = {} if spec is None else {"speculative_config": spec}
        config = EngineConfig.from_kwargs(**kw)
        engine, executor, clock = build_sim_engine(config, get_hardware("h100-sxm"), get_model("llama-3.1-8b"))
        specs = [SimRequest(f"r{i}", 0.0, [i + 1] * 200, 100) for i in range(2)]
        results[spec is None] = (simulate(engine, executor, clock, specs), engine.snapshot().spec_decode)
    (off, _), (on, stats) = results[True], results[False]
    assert stats is not None and abs(stats["per_token_acceptance"] - 0.7) < 0.08
    assert on.sim_duration_s < off.sim_duration_s   # batch 2 on an H100 is memory-bound: drafts pay
