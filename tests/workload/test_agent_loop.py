"""The closed-loop agent workload (pacer.workload.agents) on the simulator: every call but a
job's last ends in a tool call, so each session's windows open while its tool runs and its last
call, which answers, closes its window (as a served chat turn with tools does)."""

from __future__ import annotations

import pytest

from pacer.config import EngineConfig
from pacer.perf.profiles import get_hardware, get_model
from pacer.sim.simulator import build_sim_engine
from pacer.workload.agents import AgentLoop, run_agent_loop


@pytest.mark.parametrize("sessions", [True, False])
def test_an_agents_last_call_closes_its_window(sessions):
    loop = AgentLoop(num_agents=4, turns=3, tool_latency=0.5, tool_latency_dist="fixed", seed=3)   # no window expires
    config = EngineConfig.from_kwargs(num_kv_blocks=400, block_size=16, max_model_len=2048)
    engine, _, _ = build_sim_engine(config, get_hardware("h200-sxm"), get_model("llama-3.1-8b"))
    result = run_agent_loop(engine, loop, sessions=sessions)
    assert len(result.job_times) == loop.num_agents
    stats = result.retention
    if not sessions:
        assert stats["windows_opened"] == 0 and stats["answered"] == 0
        return
    assert stats["windows_opened"] == loop.num_agents * loop.turns
    assert stats["returns"] == loop.num_agents * (loop.turns - 1)   # every follow-up found its window open
    assert stats["answered"] == loop.num_agents and stats["retained_blocks"] == 0
    assert result.retention_hit_tokens > 0
