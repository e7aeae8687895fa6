"""The simulator is the real Engine/Scheduler/KV manager on a virtual clock: no sim-only path,
deterministic, arrivals and concurrency handled as a front end would."""

from __future__ import annotations

import ast
import pathlib

import pacer
from pacer.clock import VirtualClock
from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.kv.manager import KVCacheManager
from pacer.perf.cost_model import RooflineCostModel
from pacer.perf.profiles import get_hardware, get_model
from pacer.sched.contract import SchedulerOutput
from pacer.sched.scheduler import Scheduler
from pacer.sim.executor import SimExecutor
from pacer.sim.simulator import SimRequest, build_sim_engine, simulate
from pacer.workload.arrivals import Poisson
from pacer.workload.generator import generate_requests
from pacer.workload.spec import builtin_workload

ROOT = pathlib.Path(pacer.__file__).parent
SIM_FILES = sorted((ROOT / "sim").glob("*.py"))
A100, L8B = get_hardware("a100-80g"), get_model("llama-3-8b")


def _engine(**kw):
    return build_sim_engine(EngineConfig.from_kwargs(**kw), A100, L8B)


def _trace(n=40, rate=50.0, seed=0):
    return generate_requests(builtin_workload("mixed"), Poisson(rate), seed=seed, num_requests=n, max_model_len=8192)


def test_simulator_runs_the_real_engine_classes():
    engine, executor, clock = _engine()
    assert type(engine) is Engine
    assert type(engine.scheduler) is Scheduler
    assert type(engine.kv) is KVCacheManager
    assert engine.executor is executor and engine.clock is clock


def test_no_sim_only_scheduler_path_in_the_source():
    """Sim modules may read SchedulerOutput but never subclass, copy or patch the core."""
    core_names = {"Scheduler", "KVCacheManager", "BlockPool", "Engine", "WaitingQueue", "Policy"}
    for path in SIM_FILES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pacer.core"):
                assert node.module in ("pacer.sched.contract", "pacer.sched.step_cost", "pacer.kv.events"), \
                    f"{path.name} imports {node.module}"
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                assert not bases & core_names, f"{path.name}: class {node.name} subclasses {bases & core_names}"
            if isinstance(node, ast.FunctionDef):
                assert not node.name.startswith(("schedule", "_schedule", "allocate", "_preempt")), (
                    f"{path.name} defines {node.name}: scheduling belongs to pacer.sched")
            if isinstance(node, ast.Assign):   # no monkeypatching of core attributes
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute):
                        assert t.value.attr not in ("scheduler", "kv"), f"{path.name} patches {ast.unparse(t)}"


def _steps(outputs):
    return [[(s.request_id, s.start_position, s.num_tokens, s.sample) for s in o.scheduled] for o in outputs]


def test_simulated_steps_equal_a_hand_driven_engine():
    """Same requests, same step times: the simulator's steps are exactly a plain Engine's."""
    specs = [SimRequest(f"r{i}", 0.0, list(range(1, 100 + 37 * i)), 5 + 3 * i) for i in range(12)]
    cfg = EngineConfig.from_kwargs(max_num_seqs=4, max_num_batched_tokens=256, num_kv_blocks=40,
                                   enable_prefix_caching=False)   # shared prompt prefixes would relieve the KV
    cm = RooflineCostModel(A100, L8B, "bfloat16")
    engine, ex, clock = build_sim_engine(cfg, A100, L8B, cost_model=cm)
    sim_outputs: list[SchedulerOutput] = []
    engine.schedule_listeners.append(sim_outputs.append)
    simulate(engine, ex, clock, specs)

    ref_clock = VirtualClock()
    ref = Engine(cfg, SimExecutor(cm, ref_clock), None, num_kv_blocks=40, model_max_len=L8B.max_model_len,
                 clock=ref_clock, vocab_size=L8B.vocab_size)
    ref_outputs: list[SchedulerOutput] = []
    ref.schedule_listeners.append(ref_outputs.append)
    from pacer.request import SamplingParams

    for s in specs:
        ref.add_request(s.prompt_token_ids, SamplingParams(max_tokens=s.output_tokens, ignore_eos=True,
                                                           temperature=0.0), arrival_time=0.0)
    ref.run_until_done()
    assert _steps(sim_outputs) == _steps(ref_outputs)
    assert engine.scheduler.num_preemptions == ref.scheduler.num_preemptions > 0   # KV is tight: preemption ran
    assert clock.now() == ref_clock.now()


def test_deterministic_under_a_seed():
    def run(seed):
        engine, ex, clock = _engine()
        res = simulate(engine, ex, clock, _trace(seed=seed))
        return [(r.request_id, r.ttft, r.e2e, r.output_tokens) for r in res.records]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_outputs_are_forced_to_the_workload_lengths_and_all_finish():
    specs = _trace(30)
    engine, ex, clock = _engine()
    res = simulate(engine, ex, clock, specs)
    assert [r.request_id for r in res.records] == [s.request_id for s in specs]
    assert [r.output_tokens for r in res.records] == [s.output_tokens for s in specs]
    assert [r.prompt_tokens for r in res.records] == [len(s.prompt_token_ids) for s in specs]
    assert not engine.has_unfinished_requests()
    assert res.num_steps == len(res.steps) == len(ex.costs) and res.busy_s <= res.sim_duration_s + 1e-9


def test_lone_request_ttft_is_its_prefill_step_and_idle_time_is_skipped():
    engine, ex, clock = _engine()
    specs = [SimRequest("a", 0.0, list(range(1, 513)), 4), SimRequest("b", 100.0, list(range(1000, 1512)), 4)]
    res = simulate(engine, ex, clock, specs)
    a, b = res.records
    assert abs(a.ttft - ex.costs[res.steps[0].step_id].time_s) < 1e-12
    assert b.arrival_time == 100.0 and abs(b.ttft - a.ttft) < 1e-9   # the clock jumped over the idle gap
    assert res.num_steps == 8


def test_arrival_during_a_step_waits_for_the_next_step():
    engine, ex, clock = _engine()
    specs = [SimRequest("a", 0.0, list(range(1, 2049)), 2), SimRequest("b", 0.001, list(range(1, 17)), 2)]
    res = simulate(engine, ex, clock, specs)
    first_step = res.steps[0].forward_s
    assert first_step > 0.001
    b = res.records[1]
    assert b.first_scheduled_time >= first_step   # scheduled only after the running step ended
    assert b.queue_wait == b.first_scheduled_time - 0.001


def test_concurrency_caps_requests_in_flight():
    specs = [SimRequest(f"r{i}", None, list(range(1, 65)), 8) for i in range(20)]
    engine, ex, clock = _engine()
    seen = []
    engine.stats_listeners.append(lambda s: seen.append(s.num_running + s.num_waiting))
    res = simulate(engine, ex, clock, specs, concurrency=3)
    assert len(res.records) == 20 and max(seen) <= 3
    # closed loop: a request's arrival is when it was sent, so no one queues behind the cap
    assert all(r.queue_wait is not None and r.queue_wait < 0.05 for r in res.records)


def test_swap_preemption_runs_through_the_simulator_and_costs_time():
    specs = [SimRequest(f"r{i}", 0.0, list(range(1 + 1000 * i, 300 + 1000 * i)), 60) for i in range(8)]

    def run(mode):
        cfg = EngineConfig.from_kwargs(max_num_seqs=8, num_kv_blocks=64, preemption_mode=mode,
                                       enable_prefix_caching=False)
        engine, ex, clock = build_sim_engine(cfg, A100, L8B)
        res = simulate(engine, ex, clock, specs)
        return res, ex

    res_swap, ex_swap = run("swap")
    res_rec, _ = run("recompute")
    assert res_swap.num_preemptions > 0 and len(res_swap.records) == 8
    assert sum(c.comm_s for c in ex_swap.costs.values()) > 0   # swap copies were costed
    assert all(r.output_tokens == 60 for r in res_swap.records)
    assert res_rec.num_preemptions > 0


def test_simulated_engine_with_int8_kv_holds_more_blocks_and_prices_smaller_swaps() -> None:
    auto_engine, auto_ex, _ = build_sim_engine(EngineConfig.from_kwargs(), A100, L8B)
    q8_engine, q8_ex, _ = build_sim_engine(EngineConfig.from_kwargs(kv_cache_dtype="int8"), A100, L8B)
    assert q8_engine.snapshot().num_blocks >= 1.9 * auto_engine.snapshot().num_blocks
    assert q8_ex.kv_block_bytes is not None and auto_ex.kv_block_bytes is not None
    assert q8_ex.kv_block_bytes * 1.9 <= auto_ex.kv_block_bytes


def test_prompt_logprobs_prefill_costs_its_logits_rows():
    """A request asking for prompt logprobs computes a full-vocabulary logits row per prompt
    token: its simulated prefill (chunked or not) is priced for them, one without is not."""
    from pacer.request import SamplingParams

    def prefill_s(prompt_logprobs, **kw):
        engine, executor, clock = _engine(enable_prefix_caching=False, **kw)
        engine.add_request(list(range(1, 2049)), SamplingParams(max_tokens=1, ignore_eos=True,
                                                                prompt_logprobs=prompt_logprobs))
        while engine.has_unfinished_requests():
            engine.step()
        return executor.busy_s, sum(c.flops for c in executor.costs.values())

    plain, plain_flops = prefill_s(None)
    scored, scored_flops = prefill_s(1)
    lm_head_flops = 2 * L8B.hidden_size * L8B.vocab_size
    assert scored_flops - plain_flops == 2047 * lm_head_flops      # every prompt token but the last
    assert scored > plain * 1.05   # the LM head is ~7% of an 8B model: 2047 more rows of it are not free
    chunked, chunked_flops = prefill_s(1, max_num_batched_tokens=512)
    assert chunked_flops - prefill_s(None, max_num_batched_tokens=512)[1] == 2047 * lm_head_flops


def test_a_thinking_budget_is_the_predicted_length_in_the_simulator_too():
    """sjf orders by prompt + predicted output: a budgeted request's prediction is its budget plus
    an answer, not its max_tokens, in the simulator as when served."""
    def first_tokens(budget):
        engine, ex, clock = _engine(scheduling_policy="sjf", max_num_seqs=1)
        specs = [SimRequest("short", 0.0, list(range(1, 101)), 300),
                 SimRequest("think", 0.0, list(range(1, 101)), 2000, thinking_token_budget=budget)]
        res = simulate(engine, ex, clock, specs)
        assert [r.output_tokens for r in res.records] == [300, 2000]
        return {r.request_id: r.ttft for r in res.records}
    assert first_tokens(None)["short"] < first_tokens(None)["think"]
    assert first_tokens(8)["think"] < first_tokens(8)["short"]
