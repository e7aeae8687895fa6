"""The one thread that owns the model in a server: it builds the engine, prewarms it and steps it.

Why one thread, and not "build on the main thread, step on another": torch on CPU runs its ops
on OpenMP (libgomp), and libgomp gives every thread that starts a parallel region a team of
worker threads of its own. Build the model on the main thread and step it on a second one, and
the process holds two teams; libgomp then counts more threads than the machine has cores and
its workers stop spinning between parallel regions and sleep on a futex instead, to be woken
for the next one: a decode step is a few hundred such regions. Measured on a 2-core machine
(SmolLM2-135M float32, one request at 1,700 tokens of context): a decode step's forward took
29.5 ms on the thread that built the model and 33 ms on another (38,000 voluntary context
switches in 137 steps against none); `pacer serve` stepped at 35-40 ms where `LLM.generate`
took 29.5. When one thread does all of it, the process has one team and steps as fast served
as offline.

`EngineThread` runs the calls given to it in order: `call` waits for the result (and raises
what the call raised), `submit` returns a Future. The server builds the engine with `call`,
then `EngineLoop` submits its serving loop, which runs until the loop stops.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["EngineThread"]

T = TypeVar("T")


class EngineThread:
    def __init__(self, name: str = "pacer-engine") -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn()` on the thread after the calls before it; its Future holds what it returned or raised."""
        if self._closed:
            raise RuntimeError("the engine thread is closed")
        future: Future[T] = Future()
        self._calls.put((future, fn))
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn()` on the thread and wait for it (from any other thread)."""
        if threading.current_thread() is self._thread:
            return fn()
        return self.submit(fn).result()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float | None = None) -> None:
        """No more calls: the thread ends after the ones queued (waits up to `timeout` for it,
        unless called from the thread itself)."""
        if not self._closed:
            self._closed = True
            self._calls.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _work(self) -> None:
        while (item := self._calls.get()) is not None:
            future, fn = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:   # the caller re-raises it from the Future
                future.set_exception(e)
