"""EngineLoop with a scripted fake engine: outputs reach the right queues, a failing step
fails the requests in flight without killing the thread, and repeated failures stop it."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import deque
from types import SimpleNamespace

from pacer.engine.prepare import PreparedRequest
from pacer.engine.stats import EngineSnapshot
from pacer.request import RequestMetrics, SamplingParams
from pacer.server.engine_loop import EngineLoop, Route

_PREPARED = PreparedRequest([1], SamplingParams())


class FakeEngine:
    """Each request yields `n` one-token outputs, one per step; `fail_next` steps raise."""

    def __init__(self, n: int = 3) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.inbox: deque = deque()
        self.live: dict[str, int] = {}
        self.fail_next = 0
        self.num_steps = 0

    def snapshot(self) -> EngineSnapshot:
        counts = dict.fromkeys(f.name for f in dataclasses.fields(EngineSnapshot))
        counts.update({k: 0 for k, v in counts.items() if v is None})
        counts.update(num_running=len(self.live), num_steps=self.num_steps, kv_usage=0.0, prefix_caching=False,
                      evicted_blocks={})
        return EngineSnapshot(**counts)

    def add_request(self, prepared, *, request_id):
        self.inbox.append(("add", request_id))

    def abort_request(self, request_id):
        self.inbox.append(("abort", request_id))

    def has_unfinished_requests(self):
        return bool(self.inbox) or bool(self.live)

    def step(self):
        outs = []
        while self.inbox:
            kind, rid = self.inbox.popleft()
            if kind == "add":
                self.live[rid] = 0
            elif rid in self.live:
                del self.live[rid]
                outs.append(_out(rid, 0, True, "abort"))
        self.num_steps += 1
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("boom")
        for rid in list(self.live):
            self.live[rid] += 1
            done = self.live[rid] == self.n
            outs.append(_out(rid, self.live[rid], done, "length" if done else None))
            if done:
                del self.live[rid]
        return outs


def _out(rid, n, finished, reason):
    return SimpleNamespace(request_id=rid, new_token_ids=[n] if n else [], finished=finished,
                           finish_reason=reason, metrics=RequestMetrics(0.0))


async def _drain(queue):
    items = []
    while True:
        item = await asyncio.wait_for(queue.get(), 10)
        items.append(item)
        if not isinstance(item, tuple) or item[1].finished:
            return items


def test_outputs_are_routed_and_thread_idles():
    async def go():
        engine = FakeEngine()
        loop = EngineLoop(engine)
        loop.start(asyncio.get_running_loop())
        queues = [asyncio.Queue() for _ in range(3)]
        for i, q in enumerate(queues):
            loop.add(f"r{i}", _PREPARED, Route(q, i, None))
        results = [await _drain(q) for q in queues]
        steps = engine.num_steps
        loop.stop()
        return results, steps, loop

    results, steps, loop = asyncio.run(go())
    for i, items in enumerate(results):
        assert [idx for idx, _ in items] == [i] * 3
        assert [o.finish_reason for _, o in items] == [None, None, "length"]
    assert steps <= 4 and loop.num_routes == 0


def test_failing_step_fails_in_flight_and_recovers():
    async def go():
        engine = FakeEngine(n=2)
        loop = EngineLoop(engine, max_consecutive_failures=3)
        failed = []
        loop.failure_listeners.append(lambda ids, err: failed.extend(ids))
        loop.start(asyncio.get_running_loop())
        q1 = asyncio.Queue()
        engine.fail_next = 1
        loop.add("a", _PREPARED, Route(q1, 0, None))
        first = await _drain(q1)
        alive_after_one = loop.alive
        q2 = asyncio.Queue()
        loop.add("b", _PREPARED, Route(q2, 0, None))
        second = await _drain(q2)
        engine.fail_next = 3
        q3 = asyncio.Queue()
        loop.add("c", _PREPARED, Route(q3, 0, None))
        await asyncio.to_thread(loop.serving.result, 10)
        return failed, first, alive_after_one, second, loop

    failed, first, alive_after_one, second, loop = asyncio.run(go())
    assert failed[0] == "a" and alive_after_one
    assert second[-1][1].finish_reason == "length"      # the loop kept serving
    assert not loop.alive and isinstance(loop.error, RuntimeError) and loop.state.num_steps > 0


def test_a_route_that_does_not_stream_gets_only_the_finished_output():
    async def go():
        engine = FakeEngine(n=4)
        loop = EngineLoop(engine)
        seen = []
        loop.listeners.append(lambda out, route: seen.append(out.request_id))
        loop.start(asyncio.get_running_loop())
        queue = asyncio.Queue(maxsize=1)   # a reader that waits for the end needs room for one output
        loop.add("whole", _PREPARED, Route(queue, 0, None, stream=False))
        items = await _drain(queue)
        loop.stop()
        return items, seen

    items, seen = asyncio.run(go())
    assert [(i, o.finish_reason) for i, o in items] == [(0, "length")]
    assert seen == ["whole"] * 4   # the listeners (metrics, admission) still see every step's output


def test_the_loop_steps_on_the_thread_it_is_given():
    """The server builds the engine on an EngineThread and hands it over: every step runs there."""
    from pacer.server.engine_thread import EngineThread

    class RecordingEngine(FakeEngine):
        def step(self):
            self.step_threads.add(threading.get_ident())
            return super().step()

    thread = EngineThread()
    engine = thread.call(lambda: RecordingEngine())   # "built" on the thread
    engine.step_threads = set()
    built_on = thread.call(threading.get_ident)

    async def go():
        loop = EngineLoop(engine, thread=thread)
        loop.start(asyncio.get_running_loop())
        q = asyncio.Queue()
        loop.add("a", _PREPARED, Route(q, 0, None))
        items = await _drain(q)
        loop.stop()
        return items, loop

    items, loop = asyncio.run(go())
    assert items[-1][1].finish_reason == "length"
    assert engine.step_threads == {built_on} and built_on != threading.get_ident()
    assert loop.serving.done() and not loop.alive
    thread.close(10)
    assert not thread.is_alive()
