"""The engine's own thread, and the bridge from it to asyncio.

One dedicated thread calls `Engine.step()` while there is work and sleeps on a condition
variable otherwise (no polling). That thread is an `EngineThread` (pacer.server.engine_thread):
given the one the engine was built on, the loop steps there (torch's OpenMP team stays one);
without one, `start` makes its own. Each step's outputs go to the event loop in one
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

Faults are contained: the thread's whole body is guarded, so whatever raises (a step,
`has_unfinished_requests()`, `snapshot()`) every request in flight gets an answer. A failed
step fails the requests in flight and the loop goes on; after `max_consecutive_failures` in a
row it gives up: the error is set under the same lock `add` takes, so a request is either
failed with the others or refused, never left waiting. A watchdog (`healthy`) turns false when
work is pending and no step has finished for `stall_timeout` seconds: a step stuck on a lock,
a mask or a disk shows in `/health` although the thread is alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pacer.engine import Engine, EngineSnapshot, RequestOutput
from pacer.engine.prepare import PreparedRequest
from pacer.server.api.errors import log_error
from pacer.server.engine_thread import EngineThread

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
FailureListener = Callable[[list[str], str], None]      # the requests failed, the error id the log names


class EngineLoop:
    def __init__(self, engine: Engine, max_consecutive_failures: int = 3, stall_timeout: float | None = 60.0,
                 monotonic: Callable[[], float] = time.monotonic, thread: EngineThread | None = None) -> None:
        if stall_timeout is not None and not stall_timeout > 0:
            raise ValueError(f"stall_timeout must be > 0 seconds or None (no watchdog), got {stall_timeout!r}")
        self.engine = engine
        self.max_consecutive_failures = max_consecutive_failures
        self.stall_timeout = stall_timeout
        self._monotonic = monotonic
        self._progress_at = monotonic()   # when a step last finished, or work reached an idle loop
        self.num_snapshot_failures = 0
        self.listeners: list[OutputListener] = []      # called on the event loop, before routing
        self.failure_listeners: list[FailureListener] = []
        self.overflow_listeners: list[OverflowListener] = []   # a stream's queue overflowed (event loop)
        self.state: EngineSnapshot = engine.snapshot()   # replaced (never mutated) after each step
        self.error: BaseException | None = None        # set when the loop gave up
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = thread                           # the engine's own (made at start when None)
        self.serving: Future[None] | None = None        # the loop on the thread: done once it stopped or gave up
        self._loop: asyncio.AbstractEventLoop | None = None
        self._routes: dict[str, Route] = {}             # event-loop thread only
        self._live_lock = threading.Lock()
        self._live: set[str] = set()                    # ids the engine may still emit for

    # ------------------------------------------------------------------ lifecycle

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = self._thread or EngineThread()
        self.serving = self._thread.submit(self._run)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop stepping and end the thread (waits up to `timeout` for the step in progress)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.close(timeout)

    @property
    def alive(self) -> bool:
        return self.serving is not None and not self.serving.done() and self.error is None

    def stalled_for(self) -> float:
        """Seconds for which work has been pending without a step finishing (0 when idle)."""
        with self._live_lock:
            if not self._live:
                return 0.0
            since = self._progress_at
        return max(0.0, self._monotonic() - since)

    @property
    def healthy(self) -> bool:
        """Alive, and not stalled past `stall_timeout` (the watchdog `/health` reports)."""
        return self.alive and (self.stall_timeout is None or self.stalled_for() <= self.stall_timeout)

    # ------------------------------------------------------------------ requests (event loop)

    def add(self, request_id: str, prepared: PreparedRequest, route: Route) -> None:
        """Queue one prepared engine request (`Engine.prepare`). Raises RuntimeError once the
        loop has given up (checked under the lock the loop sets its error under)."""
        with self._live_lock:
            if self.error is not None:
                raise RuntimeError("the engine loop stopped after a failure")
            if not self._live:   # an idle loop: the watchdog counts from now
                self._progress_at = self._monotonic()
            self._live.add(request_id)
        self._routes[request_id] = route
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

    def session_answered(self, tenant: str, session: str) -> None:
        """From the event loop: close the session's retention window (`Engine.session_answered`)."""
        self.engine.session_answered(tenant, session)
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
        try:
            self._serve()
        except BaseException as e:   # anything that escaped the guarded body: answer everyone, then end
            log.exception("the engine loop failed; failing every request in flight")
            self._give_up(e)

    def _serve(self) -> None:
        failures = 0
        while True:
            try:
                if not self._wait_for_work():
                    return
                outputs = self.engine.step()
            except Exception as e:   # keep serving: fail what is in flight, not the process
                failures += 1
                if failures >= self.max_consecutive_failures:
                    error_id = log_error(f"engine step failed ({failures} in a row); the loop stops", e)
                    self._give_up(e, error_id)
                    return
                error_id = log_error(f"engine step failed ({failures} in a row); failing the requests in flight", e)
                self._fail_in_flight(error_id)
                continue
            failures = 0
            self._progress_at = self._monotonic()
            self._publish_state()
            if outputs:
                self._call(self._dispatch, outputs)

    def _wait_for_work(self) -> bool:
        """Sleep until the engine has work (True) or the loop is stopping (False)."""
        with self._cv:
            while not self._stopping and not self.engine.has_unfinished_requests():
                self._cv.wait()
            return not self._stopping

    def _publish_state(self) -> None:
        """The snapshot `/metrics` and `/debug/state` read; a failing snapshot keeps the last one
        (the step's outputs are real and still go out), logged on the first failure in a row."""
        try:
            self.state = self.engine.snapshot()
        except Exception:
            self.num_snapshot_failures += 1
            if self.num_snapshot_failures == 1:
                log.exception("engine snapshot failed; /metrics and /debug/state keep the last one")
            return
        self.num_snapshot_failures = 0

    def _give_up(self, error: BaseException, error_id: str | None = None) -> None:
        self._fail_in_flight(error_id or uuid.uuid4().hex[:12], error)

    def _fail_in_flight(self, error_id: str, error: BaseException | None = None) -> None:
        """Fail what is in flight; with `error`, give up: the error is set under `_live_lock` with
        the ids read, so an `add` either came first (and is failed here) or sees it (and is refused)."""
        with self._live_lock:
            self.error = error or self.error
            ids = list(self._live)
        for rid in ids:
            try:
                self.engine.abort_request(rid)
            except Exception:
                log.exception("abort of %s failed", rid)
        self._call(self._fail_routes, ids, error_id)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):   # the event loop closed during shutdown
            self._loop.call_soon_threadsafe(fn, *args)

    # ------------------------------------------------------------------ event loop side

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            route = self._routes.get(out.request_id)
            if route is None:
                continue
            _tell(self.listeners, "output", out, route)
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
        _tell(self.overflow_listeners, "overflow", request_ids, route)

    def _fail_routes(self, request_ids: list[str], error_id: str) -> None:
        _tell(self.failure_listeners, "failure", request_ids, error_id)


def _tell(listeners: list[Callable[..., None]], kind: str, *args: Any) -> None:
    """Call each listener; one that raises is logged, and the rest are still told."""
    for listener in listeners:
        try:
            listener(*args)
        except Exception:
            log.exception("%s listener failed", kind)

