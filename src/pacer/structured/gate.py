"""The compiles an engine waits on: request id -> the future of its grammar.

The requests themselves wait in the scheduler's queue as WAITING_FOR_GRAMMAR (queued in
policy order and counted, but never admitted: no seat, no KV blocks, never a preemption
victim). At each step's start the scheduler takes the finished compiles from here (through
pacer.structured.runtime) and marks their requests ready (binding a matcher), or finishes them
with the compile's error. An abort or a shed finishes the request in the scheduler; its compile
is dropped here and, once no other request waits on it, cancelled by the manager. Engine thread only, except `ready`, the event
compiles set.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

__all__ = ["GrammarWaits"]


class GrammarWaits:
    def __init__(self, ready: Any) -> None:
        self._futures: dict[str, Future[Any]] = {}   # request id -> compile future, in arrival order
        self._ready = ready                          # threading.Event set by compiles

    def __len__(self) -> int:
        return len(self._futures)

    def add(self, request_id: str, future: Future[Any]) -> None:
        self._futures[request_id] = future

    def discard(self, request_id: str) -> Future[Any] | None:
        """Forget `request_id`'s wait; its compile future (None: it had none)."""
        return self._futures.pop(request_id, None)

    def take_done(self) -> list[tuple[str, Any, BaseException | None]]:
        """(request id, compiled grammar or None, error or None) of each finished compile,
        in arrival order."""
        self._ready.clear()
        done = []
        for rid, future in list(self._futures.items()):
            if future.done():
                del self._futures[rid]
                error = future.exception()
                done.append((rid, None if error is not None else future.result(), error))
        return done

    def wait(self, timeout: float) -> None:
        """Block the idle engine until some compile finishes (or `timeout`)."""
        if self._futures and not any(f.done() for f in self._futures.values()):
            self._ready.wait(timeout)
