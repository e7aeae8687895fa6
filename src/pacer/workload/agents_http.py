"""The agent loop (`pacer.workload.agents`) against a server over HTTP: `pacer bench --workload
agent-loop --base-url URL`. Each agent is a task that sends its history as a streamed completion,
appends the text that came back and a tool's answer, waits the tool's latency and sends again,
until its job's last call; a chat tenant's requests arrive beside them (Poisson). The agents name
their session in the `x-session-id` header (pacer's agent sessions; other servers ignore it).

What the client can see is what it reports: job completion time, first and follow-up TTFT, the
chat tenant's TTFT, and the cached prompt tokens the server reports in `usage`; the retention
counters are the difference of the server's `/metrics` `session_retention_*` series across the
run (absent on servers without them).
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from pacer.workload.agents import AgentLoop, AgentLoopResult
from pacer.workload.client import OpenAIClient
from pacer.workload.spec import RequestSpec
from pacer.workload.text import TextSource

__all__ = ["run_agent_loop_http"]

RETENTION_SERIES = ("windows_opened", "returns", "expiries", "releases", "answered", "capped", "demoted_blocks", "hit_tokens")


async def run_agent_loop_http(client: OpenAIClient, loop: AgentLoop, text: TextSource, *,
                              sessions: bool = True) -> AgentLoopResult:
    """Every agent's job to completion against `client`'s server; `sessions` False sends the same
    calls without naming a session."""
    rng = random.Random(loop.seed)
    system = text.segment(loop.system_len, rng).text
    tasks = [text.segment(loop.task_len, rng).text for _ in range(loop.num_agents)]
    result = AgentLoopResult()
    before = await _retention_counters(client)
    t0 = time.perf_counter()
    stop = asyncio.Event()
    chat = asyncio.create_task(_chat_tenant(client, loop, text, t0, stop, result))
    await asyncio.gather(*(_agent(client, loop, text, i, system + tasks[i], t0, sessions, result)
                           for i in range(loop.num_agents)))
    stop.set()
    await chat
    result.wall = time.perf_counter() - t0
    after = await _retention_counters(client)
    result.retention = {k: int(after[k] - before.get(k, 0.0)) for k in after}
    result.retention_hit_tokens = result.retention.get("hit_tokens", 0)
    return result


async def _agent(client: OpenAIClient, loop: AgentLoop, text: TextSource, i: int, history: str, t0: float,
                 sessions: bool, result: AgentLoopResult) -> None:
    rng = random.Random(f"{loop.seed}:agent:{i}")
    name = f"agent-{i}"
    headers = {"x-session-id": name} if sessions else None
    started = time.perf_counter() - t0
    for turn in range(loop.turns):
        spec = RequestSpec(f"{name}-{turn}", "agent", history, (), loop.output_len, session=name if sessions else None,
                           turn=turn, tenant="agents")
        rec, reply = await client.send_with_text(spec, t0, headers)
        if not rec.ok:
            raise RuntimeError(f"agent call {spec.request_id} failed: {rec.error}")
        ttft = None if rec.first_token_time is None else rec.first_token_time - rec.arrival_time
        if turn == 0:
            result.first_ttfts.append(ttft or 0.0)
        else:
            result.followup_ttfts.append(ttft or 0.0)
            result.followup_prompt_tokens += rec.prompt_tokens
            result.followup_cached_tokens += rec.cached_tokens
        if turn + 1 == loop.turns:
            result.job_times.append((rec.finish_time or 0.0) - started)
            return
        history += reply + text.segment(loop.tool_output_len, rng).text
        await asyncio.sleep(loop.draw_latency(rng))   # the tool runs: the workload's think time


async def _chat_tenant(client: OpenAIClient, loop: AgentLoop, text: TextSource, t0: float, stop: asyncio.Event,
                       result: AgentLoopResult) -> None:
    if loop.chat_rate <= 0:
        return
    rng = random.Random(loop.seed + 1)
    pending: set[asyncio.Task[Any]] = set()
    n = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), rng.expovariate(loop.chat_rate))   # the next arrival
        except TimeoutError:
            pass
        if stop.is_set():
            break
        seg = text.segment(loop.chat_prompt_len, rng)
        spec = RequestSpec(f"chat-{n}", "chat", seg.text, seg.token_ids, loop.chat_output_len, tenant="chat")
        n += 1
        task = asyncio.create_task(client.send(spec, t0))
        pending.add(task)
        task.add_done_callback(lambda t: _chat_done(t, pending, result))
    if pending:
        await asyncio.gather(*pending)


def _chat_done(task: asyncio.Task[Any], pending: set[asyncio.Task[Any]], result: AgentLoopResult) -> None:
    pending.discard(task)
    rec = task.result()
    if rec.ok and rec.first_token_time is not None:
        result.chat_ttfts.append(rec.first_token_time - rec.arrival_time)


async def _retention_counters(client: OpenAIClient) -> dict[str, float]:
    """The server's `session_retention_*` counters (either metric prefix); {} without them."""
    try:
        body = await client.metrics_text()
    except Exception:   # a server without /metrics (or behind a key the bench lacks): no counters
        return {}
    out: dict[str, float] = {}
    for line in body.splitlines():
        for name in RETENTION_SERIES:
            for prefix in ("pacer_session_retention_", "vllm:session_retention_"):
                head = prefix + name
                if line.startswith((head + "{", head + "_total{")):
                    out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out
