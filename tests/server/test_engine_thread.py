"""EngineThread: the one thread a server's model is built, prewarmed and stepped on
(pacer.server.engine_thread says why), and `build_service` using it with the real model."""

from __future__ import annotations

import argparse
import asyncio
import json
import threading

import pytest

from pacer.cli.serve import add_args as add_serve_args
from pacer.engine import Engine
from pacer.engine.prepare import PreparedRequest
from pacer.request import SamplingParams
from pacer.server.cli import build_service
from pacer.server.engine_loop import Route
from pacer.server.engine_thread import EngineThread


def test_calls_run_in_order_on_one_thread_and_raise_to_the_caller():
    thread = EngineThread()
    seen: list[tuple[int, int]] = []
    futures = [thread.submit(lambda i=i: seen.append((i, threading.get_ident()))) for i in range(5)]
    for f in futures:
        f.result(10)
    assert [i for i, _ in seen] == list(range(5))
    idents = {ident for _, ident in seen}
    assert len(idents) == 1 and idents != {threading.get_ident()}

    def boom():
        raise ValueError("bad weights")

    with pytest.raises(ValueError, match="bad weights"):
        thread.call(boom)
    assert thread.call(lambda: 7) == 7   # a failed call does not end the thread
    assert thread.call(lambda: thread.call(lambda: 8)) == 8   # a call from the thread itself runs inline
    thread.close(10)
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        thread.submit(lambda: None)


def test_build_service_builds_prewarms_and_steps_the_engine_on_one_thread(tmp_path, monkeypatch):
    """The real default model through `build_service` (no engine given, as `pacer serve` runs it)."""
    threads: dict[str, set[int]] = {"build": set(), "prewarm": set(), "step": set()}
    build, step = Engine.from_kwargs, Engine.step

    def recorded_build(**kwargs):
        threads["build"].add(threading.get_ident())
        return build(**kwargs)

    def recorded_step(self):
        threads["step"].add(threading.get_ident())
        return step(self)

    import pacer.engine.prewarm as prewarm_module

    prewarm = prewarm_module.prewarm

    def recorded_prewarm(*args, **kwargs):
        threads["prewarm"].add(threading.get_ident())
        return prewarm(*args, **kwargs)

    monkeypatch.setattr(Engine, "from_kwargs", staticmethod(recorded_build))
    monkeypatch.setattr(Engine, "step", recorded_step)
    monkeypatch.setattr(prewarm_module, "prewarm", recorded_prewarm)
    warm = tmp_path / "prewarm.jsonl"
    warm.write_text(json.dumps("You are a helpful assistant. " * 4) + "\n")
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    service = build_service(parser.parse_args(["--port", "0", "--num-threads", "1", "--max-num-seqs", "2",
                                               "--prewarm", str(warm)]))
    try:
        async def one_request():
            service.start()
            q: asyncio.Queue = asyncio.Queue()
            prepared = PreparedRequest(service.engine.tokenizer.encode("Hello"), SamplingParams(max_tokens=3))
            service.loop.add("r", prepared, Route(q, 0, None))
            while True:
                _, out = await asyncio.wait_for(q.get(), 60)
                if out.finished:
                    return out

        out = asyncio.run(one_request())
    finally:
        service.loop.stop()
        service.engine.shutdown()
    assert len(out.token_ids) == 3
    assert len(threads["build"]) == 1 and threads["build"] == threads["prewarm"] == threads["step"]
    assert threads["build"] != {threading.get_ident()}
