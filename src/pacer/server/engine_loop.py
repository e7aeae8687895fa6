"""The engine's own thread, and the bridge from it to asyncio.

One dedicated thread calls `Engine.step()` while there is work and sleeps on a condition
variable otherwise (no polling). Each step's outputs go to the event loop in one
`call_soon_threadsafe` callback, which tells the listeners (metrics, admission, request log)
and routes each `RequestOutput` (a delta: what its step added) to the asyncio queue of the
HTTP request it belongs to: every output of a stream, only the finished one otherwise.
HTTP handlers never touch the engine except through the thread-safe `add_request` and
`abort_request`. After every step the thread publishes the engine's `snapshot()`, which
`/metrics` and `/debug/state` read without locking.

A stream's queue is bounded (`Route.max_queued`): a client that stops reading would otherwise
pile outputs up without end. When an output of a running request finds its queue full, the
loop drops the queue's backlog, aborts every request feeding that queue (their KV is freed at
the next step) and tells the overflow listeners, which end the stream with an error.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pacer.engine import Engine, EngineSnapshot, RequestOutput
from pacer.engine.prepare import PreparedRequest

__all__ = ["EngineLoop", "Route"]

log = logging.getLogger("pacer.server")


@dataclass(slots=True)
class Route:
    """Where one engine request's outputs go: its HTTP request's queue, and its server-side context."""

    queue: asyncio.Queue[Any]
    index: int
    context: Any
    stream: bool = True             # False: only the finished output is queued (the reader waits for it)
    max_queued: int | None = None   # items `queue` may hold; a running request's output past it aborts
    overflowed: bool = False        # aborted for its unread backlog; nothing more is queued


OutputListener = Callable[[RequestOutput, Route], None]
OverflowListener = Callable[[list[str], Route], None]   # the requests aborted, the route that overflowed


class EngineLoop:
    def __init__(self, engine: Engine, max_consecutive_failures: int = 3) -> None:
        self.engine = engine
        self.max_consecutive_failures = max_consecutive_failures
        self.listeners: list[OutputListener] = []      # called on the event loop, before routing
        self.failure_listeners: list[Callable[[list[str], BaseException], None]] = []
        self.overflow_listeners: list[OverflowListener] = []   # a stream's queue overflowed (event loop)
        self.state: EngineSnapshot = engine.snapshot()   # replaced (never mutated) after each step
        self.error: BaseException | None = None        # set when the loop gave up
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._routes: dict[str, Route] = {}             # event-loop thread only
        self._live_lock = threading.Lock()
        self._live: set[str] = set()                    # ids the engine may still emit for

    # ------------------------------------------------------------------ lifecycle

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="pacer-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # ------------------------------------------------------------------ requests (event loop)

    def add(self, request_id: str, prepared: PreparedRequest, route: Route) -> None:
        """Queue one prepared engine request (`Engine.prepare`)."""
        if self.error is not None:
            raise RuntimeError(f"the engine loop stopped after a failure: {self.error}")
        self._routes[request_id] = route
        with self._live_lock:
            self._live.add(request_id)
        try:
            self.engine.add_request(prepared, request_id=request_id)
        except BaseException:
            self._routes.pop(request_id, None)
            with self._live_lock:
                self._live.discard(request_id)
            raise
        self._wake()

    def abort(self, request_id: str) -> None:
        """Abort from the event loop; the engine applies it at its next step."""
        if request_id in self._routes:
            self.engine.abort_request(request_id)
            self._wake()

    def route(self, request_id: str) -> Route | None:
        return self._routes.get(request_id)

    @property
    def num_routes(self) -> int:
        return len(self._routes)

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        failures = 0
        while True:
            with self._cv:
                while not self._stopping and not self.engine.has_unfinished_requests():
                    self._cv.wait()
                if self._stopping:
                    return
            try:
                outputs = self.engine.step()
                failures = 0
            except Exception as e:   # keep serving: fail what is in flight, not the process
                failures += 1
                log.exception("engine step failed (%d in a row); failing the requests in flight", failures)
                self._fail_in_flight(e)
                if failures >= self.max_consecutive_failures:
                    self.error = e
                    return
                continue
            self.state = self.engine.snapshot()
            if outputs:
                self._call(self._dispatch, outputs)

    def _fail_in_flight(self, error: BaseException) -> None:
        with self._live_lock:
            ids = list(self._live)
        for rid in ids:
            self.engine.abort_request(rid)
        self._call(self._fail_routes, ids, error)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:   # event loop closed during shutdown
            pass

    # ------------------------------------------------------------------ event loop side

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            route = self._routes.get(out.request_id)
            if route is None:
                continue
            for listener in self.listeners:
                try:
                    listener(out, route)
                except Exception:
                    log.exception("output listener failed")
            if out.finished:
                del self._routes[out.request_id]
                with self._live_lock:
                    self._live.discard(out.request_id)
            if route.overflowed or not (route.stream or out.finished):
                continue
            if not out.finished and route.max_queued is not None and route.queue.qsize() >= route.max_queued:
                self._overflow(route)
                continue
            route.queue.put_nowait((route.index, out))

    def _overflow(self, route: Route) -> None:
        """The reader of `route.queue` fell `max_queued` items behind: drop what waits unread (that
        memory is freed now), abort every request still feeding the queue (their KV is freed at
        the next step), and tell the overflow listeners."""
        request_ids = [rid for rid, r in self._routes.items() if r.queue is route.queue]
        for rid in request_ids:
            self._routes[rid].overflowed = True
            self.engine.abort_request(rid)
        while not route.queue.empty():
            route.queue.get_nowait()
        self._wake()
        for listener in self.overflow_listeners:
            try:
                listener(request_ids, route)
            except Exception:
                log.exception("overflow listener failed")

    def _fail_routes(self, request_ids: list[str], error: BaseException) -> None:
        for listener in self.failure_listeners:
            listener(request_ids, error)
