"""The grammar gate: requests whose grammar is still compiling, held outside the scheduler.

A request enters when `Engine.add_request` saw `structured_outputs` and leaves when its
compile finished: into the scheduler with a bound matcher, or finished with its error.
While held it has no running slot and no KV blocks; `len(gate)` is how many wait (the
engine's snapshot and /metrics show it as waiting for a grammar). Engine thread only,
except `ready`, the event compile threads set.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

__all__ = ["GrammarGate"]


class GrammarGate:
    def __init__(self, ready: Any) -> None:
        self._held: dict[str, tuple[Any, Future[Any]]] = {}   # request id -> (tracked, compile future)
        self._ready = ready                                   # threading.Event set by compiles

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, request_id: str, tracked: Any, future: Future[Any]) -> None:
        self._held[request_id] = (tracked, future)

    def remove(self, request_id: str) -> Any | None:
        """Take a held request out (an abort); its compile keeps running for the cache."""
        entry = self._held.pop(request_id, None)
        return None if entry is None else entry[0]

    def take_done(self) -> list[tuple[Any, Any, BaseException | None]]:
        """(tracked, compiled grammar or None, error or None) of each request whose compile
        finished, in arrival order."""
        self._ready.clear()
        done = []
        for rid, (tracked, future) in list(self._held.items()):
            if future.done():
                del self._held[rid]
                error = future.exception()
                done.append((tracked, None if error is not None else future.result(), error))
        return done

    def wait(self, timeout: float) -> None:
        """Block the idle engine until some compile finishes (or `timeout`)."""
        if self._held and not any(f.done() for _, f in self._held.values()):
            self._ready.wait(timeout)
