"""Server test fixtures: one real engine (the default model) for the whole session, served by
in-process uvicorn on 127.0.0.1 and a free port; each module starts its own server on it.

The engine is stepped offline (LLM.generate / chat) to compute reference outputs only while
no server runs; a server's engine thread owns stepping until the server stops.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from pacer.cli.serve import add_args as add_serve_args
from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.llm import LLM
from pacer.model.executor import ModelExecutor
from pacer.request import SamplingParams
from pacer.server.cli import build_service

MODEL = "SmolLM2-135M-Instruct"


def wait_for(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll `cond` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)   # polling interval, not synchronisation: the condition decides


@dataclass
class Served:
    base_url: str
    service: Any
    server: Any

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"


@contextlib.contextmanager
def serve(engine: Any, *flags: str, send_buffer: int | None = None) -> Iterator[Served]:
    """`send_buffer`: the kernel send buffer (bytes) of the server's connections (default: the
    kernel's, autotuned up to megabytes), so a client that stops reading blocks it sooner."""
    import uvicorn

    from pacer.server.app import create_app

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    args = parser.parse_args(["--port", "0", *flags])
    service = build_service(args, engine=engine)
    config = uvicorn.Config(create_app(service), host="127.0.0.1", port=0, log_level="warning",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    sockets = None
    if send_buffer is not None:   # accepted connections inherit the listening socket's buffer size
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
        listener.bind(("127.0.0.1", 0))
        sockets = [listener]
    thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, name="uvicorn-test", daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive(), 60, "uvicorn to start")
    assert server.started, "uvicorn failed to start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Served(f"http://127.0.0.1:{port}", service, server)
    finally:
        server.should_exit = True
        thread.join(30)
        # hand the engine back idle: finish whatever the last aborts left in its inbox
        while engine.has_unfinished_requests():
            engine.step()


GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


def wrapped_engine(llm: LLM, wrap: Callable[[Any], Any], num_blocks: int = 512, **engine_kwargs: Any) -> Engine:
    """A fresh engine over the session's loaded model whose executor is `wrap(ModelExecutor)`
    (an engine's executor is fixed when it is built: tests wrap it, never swap it);
    `engine_kwargs`: its config (e.g. tenant_isolation="isolated", which API keys imply)."""
    base = llm.engine
    cfg = EngineConfig.from_kwargs(num_kv_blocks=num_blocks, **engine_kwargs)
    executor = wrap(ModelExecutor(base.executor.model, num_blocks, cfg.cache.block_size))
    return Engine(cfg, executor, base.tokenizer, num_blocks, base.max_model_len, base.eos_token_ids,
                  vocab_size=base.vocab_size)


class GatedExecutor:
    """Wraps an executor: `close()` makes the next execute block until `open()`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._gate = threading.Event()
        self._gate.set()
        self.blocked = threading.Event()

    def close(self) -> None:
        self._gate.clear()

    def open(self) -> None:
        self._gate.set()

    def execute(self, out: Any) -> Any:
        if not self._gate.is_set():
            self.blocked.set()
            self._gate.wait(60)
        return self.inner.execute(out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FaultyExecutor:
    """Wraps an executor: raises whenever a scheduled chunk contains `poison_token`."""

    def __init__(self, inner: Any, poison_token: int) -> None:
        self.inner = inner
        self.poison_token = poison_token
        self.num_failures = 0

    def execute(self, out: Any) -> Any:
        if any(self.poison_token in sr.token_ids for sr in out.scheduled):
            self.num_failures += 1
            raise RuntimeError("injected executor failure")
        return self.inner.execute(out)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def client(served: Any) -> Iterator[openai.OpenAI]:
    """The official `openai` client against the module's `served` server (each module serves its own)."""
    with openai.OpenAI(base_url=served.v1, api_key="none", max_retries=0) as c:
        yield c
