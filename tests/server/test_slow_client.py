"""A streaming client that stops reading: past `--max-queued-outputs` unread outputs its
request is aborted (KV freed), counted, and its stream ends with an OpenAI error event; the
other requests are unaffected. Once through the service over the fake executor, stepped in
lockstep with the test, and once over real HTTP with a client that stops reading its socket."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import httpx

from pacer.clock import VirtualClock
from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.request import SamplingParams
from pacer.sched.contract import ModelOutput, SchedulerOutput
from pacer.server.api.errors import APIError
from pacer.server.api.protocol import parse_completion
from pacer.server.service import Service, ServiceOptions
from tests.fakes import EOS, FakeExecutor, reference_output
from tests.server.conftest import GREEDY, MODEL, serve, wait_for

SLOW_COUNTER = "pacer_request_slow_client_aborted_total"


class Tickets:
    """Wraps an executor: each step runs only on a ticket the test hands out, so the test
    knows which step's outputs the event loop has seen (`open()` ends the gating)."""

    def __init__(self, inner: FakeExecutor) -> None:
        self.inner = inner
        self.tickets = threading.Semaphore(0)
        self.gating = True

    def give(self) -> None:
        self.tickets.release()

    def open(self) -> None:
        self.gating = False
        self.tickets.release()

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        if self.gating:
            assert self.tickets.acquire(timeout=30), "no ticket for the next step"
        return self.inner.execute(out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_unread_stream_is_aborted_at_the_bound_through_the_service():
    async def go() -> tuple[Any, ...]:
        cfg = EngineConfig.from_kwargs(num_kv_blocks=128, block_size=4, max_model_len=256)
        fake = FakeExecutor(4)
        tickets = Tickets(fake)
        engine = Engine(cfg, tickets, tokenizer=None, num_kv_blocks=128, model_max_len=256, eos_token_ids=(EOS,),
                        clock=VirtualClock(), vocab_size=1000)
        fake.scheduler = engine.scheduler
        service = Service(engine, ServiceOptions(served_model_names=("fake",), max_queued_outputs=4))
        slow_finals, states = [], []

        def on_output(out: Any, route: Any) -> None:
            if out.request_id.startswith(slow.api_id) and out.finished:
                slow_finals.append(out)
                states.append(service.loop.state)   # published after the step that aborted it

        service.loop.listeners.append(on_output)
        service.start()
        body = {"model": "fake", "prompt": [1, 2, 3, 4, 5], "max_tokens": 200, "ignore_eos": True, "stream": True}
        # the fast one first: every step (the first one included) then runs it, one output per ticket
        fast = await service.submit(parse_completion({**body, "prompt": [9, 8, 7], "max_tokens": 30}))
        slow = await service.submit(parse_completion(body))   # nobody reads its queue
        fast_ids: list[int] = []
        while True:   # one step per ticket; the fast stream's output says the step was dispatched
            tickets.give()
            _, out = await asyncio.wait_for(fast.queue.get(), 30)
            fast_ids += out.new_token_ids
            if out.finished:
                break
        tickets.open()
        slow_items = [slow.queue.get_nowait() for _ in range(slow.queue.qsize())]
        counted = service.metrics.registry.get_sample_value(SLOW_COUNTER, {"model_name": "fake"})
        await service.shutdown()
        return slow_finals, states, slow_items, counted, fast_ids, out, engine.snapshot()

    slow_finals, states, slow_items, counted, fast_ids, fast_final, end = asyncio.run(go())
    (slow_final,) = slow_finals
    assert slow_final.finish_reason == "abort" and slow_final.num_output_tokens <= 4 + 2   # aborted at the bound
    assert states[0].num_running == 1   # the step that aborted it released its KV; the fast one runs on
    (error,) = slow_items   # the unread backlog was dropped; the stream ends with the reason
    assert isinstance(error, APIError) and error.status == 408 and error.code == "stream_backlog_exceeded"
    assert "--max-queued-outputs" in error.message
    assert counted == 1
    assert fast_final.finish_reason == "length" and fast_ids == reference_output([9, 8, 7], SamplingParams(
        max_tokens=30, ignore_eos=True))
    assert end.num_running == 0 and end.num_available_blocks == end.num_blocks


def _stalled_stream(port: int, body: dict[str, Any]) -> socket.socket:
    """Send a streaming request on a socket with a tiny receive buffer and read only the
    response's first bytes: the client then stops reading."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    assert sock.recv(64).startswith(b"HTTP/1.1 200")
    return sock


def _read_to_end(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    chunks = []
    while data := sock.recv(1 << 16):
        chunks.append(data)
        if b"data: [DONE]" in b"".join(chunks[-2:]):
            break
    return b"".join(chunks)


def test_client_that_stops_reading_is_aborted_over_http(llm):
    """Chat deltas with 20 top logprobs are ~2 KB each: with small socket buffers (the server
    transport's 64 KiB on top) the stream blocks within some fifty tokens, then the server's
    queue reaches the bound and the request is aborted while a normal stream beside it
    completes unchanged."""
    prompt = [{"role": "user", "content": "Count from one to one thousand, in words."}]
    ref = llm.chat(prompt, GREEDY)[0].text
    with serve(llm.engine, "--max-queued-outputs", "2", send_buffer=4096) as served:
        port = int(served.base_url.rsplit(":", 1)[1])
        slow = _stalled_stream(port, {"model": MODEL, "messages": prompt, "stream": True, "max_tokens": 3000,
                                      "ignore_eos": True, "logprobs": True, "top_logprobs": 20, "temperature": 0})
        try:
            with httpx.stream("POST", served.v1 + "/chat/completions", timeout=120, json={
                    "model": MODEL, "messages": prompt, "stream": True, "max_tokens": 16, "temperature": 0}) as r:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]
                           if json.loads(e)["choices"])
            assert events[-1] == "[DONE]" and text == ref
            metrics = served.service.metrics
            wait_for(lambda: metrics.registry.get_sample_value(SLOW_COUNTER, {"model_name": MODEL}), 120,
                     "the slow client to be aborted")
            wait_for(lambda: served.service.loop.num_routes == 0, 30, "the aborted request to finish")
            state = served.service.loop.state
            assert state.num_running == 0 and state.num_available_blocks == state.num_blocks   # its KV is free
            tail = _read_to_end(slow).decode(errors="replace")
        finally:
            slow.close()
    *_, last_event, done = [line for line in tail.splitlines() if line.startswith("data: ")]   # (chunked framing aside)
    assert done == "data: [DONE]"
    error = json.loads(last_event[6:])["error"]
    assert error["code"] == "stream_backlog_exceeded" and "--max-queued-outputs" in error["message"]
