"""`pacer serve --replicas N --router NAME`: N pacer engines as Ray Serve replicas behind one
OpenAI-compatible ingress.

- `PacerReplica` (N replicas): a whole single-engine pacer server (the same `Service` and
  FastAPI app, so flags, streaming, errors and /metrics are one engine's), driven through
  ASGI in-process; it publishes KV events on its own ports (configured ports + its rank)
  and reports its load, KV event addresses and metrics text as Ray Serve routing stats.
- `PacerIngress` (1 replica): HTTP in, admission (`--max-waiting` holds once, here),
  tokenizes the prompt for routing, forwards to a replica through a deployment handle and
  streams the answer back. A replica that dies mid-request gives a clear 503, never a hang.
- `PacerRequestRouter`: Ray Serve's request-router interface around `pacer.deploy.routers`
  (the same routers `pacer sim --replicas` runs); it subscribes to every replica's KV
  events (ZMQ) for the `prefix` router.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from ray import serve
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from pacer.deploy.gate import REPLICA_HEADER
from pacer.deploy.kv_index import BlockIndex, from_wire
from pacer.deploy.routers import Cluster, RouteRequest, make_router

__all__ = ["PacerReplica", "PacerRequestRouter", "LIVE_STATS", "live_stats"]

log = logging.getLogger("pacer.deploy")
LIVE_STATS: dict[str, dict[str, Any]] = {}   # replica id -> its latest routing stats (read by the ingress)


def live_stats() -> dict[str, dict[str, Any]]:
    """This process's LIVE_STATS, looked up through sys.modules: Ray Serve ships the router
    class by value, so a module global the router names directly is a copy the ingress never
    sees."""
    return cast(dict[str, dict[str, Any]], importlib.import_module(__name__).LIVE_STATS)
STATS_REFRESH_S = 1.0   # how often the router re-reads the replicas' routing stats without a request


# ---------------------------------------------------------------------- replica

@serve.deployment(name="PacerReplica")
class PacerReplica:
    def __init__(self, serve_args: dict[str, Any]) -> None:
        import argparse

        from pacer.server.app import create_app
        from pacer.server.cli import attach_kv_events, build_service

        args = argparse.Namespace(**serve_args)
        args.max_waiting = None   # admission holds once, at the ingress
        kv_events, args.kv_events_config = args.kv_events_config, None
        ctx = serve.get_replica_context()
        self.rank = int(getattr(getattr(ctx, "rank", None), "rank", 0) or 0)
        self.replica_id = ctx.replica_id.unique_id
        self.service = build_service(args)
        self.publisher = attach_kv_events(self.service, kv_events, self.rank)
        self.app = create_app(self.service)
        self._started = False

    def _start(self) -> None:
        if not self._started:
            self.service.start()
            self._started = True

    async def handle(self, route: dict[str, Any], request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """One HTTP request through the replica's own app: yields {"status", "headers"} and
        then {"body"} chunks as the app sends them, and last {"output_tokens": {key name: n}}:
        the tokens its keys' requests generated since the last report, which the ingress
        debits from the keys' token rates. Closing the generator (the client went away) is a
        disconnect for the app, which aborts the engine requests."""
        self._start()
        async for item in asgi_call(self.app, request, extra_headers=[(REPLICA_HEADER, str(self.rank))]):
            yield item
        used = dict(self.service.output_tokens_by_key)
        self.service.output_tokens_by_key.clear()
        if used:
            yield {"output_tokens": used}

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve asks every `request_routing_stats_period_s`; runs off the request loop, so
        it only reads (the engine loop starts with the first request, on the request loop)."""
        load = 0
        if self._started:
            self.service.update_gauges()
            s = self.service.loop.state
            load = s.num_waiting + s.num_running
        pub = self.publisher
        return {"rank": self.rank, "load": load,
                "kv_endpoint": pub.endpoint if pub else None, "kv_replay_endpoint": pub.replay_endpoint if pub else None,
                "kv_topic": pub.config.topic if pub else "", "metrics": self.service.metrics.render().decode()}

    def check_health(self) -> None:
        if self._started and not self.service.loop.alive:
            raise RuntimeError("the engine loop stopped")


async def asgi_call(app: Any, request: dict[str, Any],
                    extra_headers: list[tuple[str, str]] = ()) -> AsyncIterator[dict[str, Any]]:   # type: ignore[assignment]
    """Drive an ASGI app for one request {"method", "path", "query", "headers", "body"}."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": request["method"],
             "scheme": "http", "path": request["path"], "raw_path": request["path"].encode(),
             "query_string": request.get("query", "").encode(), "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in request["headers"]],
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    sent: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    gone = asyncio.Event()
    body_read = False

    async def receive() -> dict[str, Any]:
        nonlocal body_read
        if not body_read:
            body_read = True
            return {"type": "http.request", "body": request["body"], "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await sent.put(message)

    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: sent.put_nowait(None))
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                headers = [(k.decode(), v.decode()) for k, v in message.get("headers", [])]
                yield {"status": message["status"], "headers": headers + list(extra_headers)}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield {"body": message["body"]}
                if not message.get("more_body"):
                    break
        if task.done() and task.exception() is not None:
            raise task.exception()   # type: ignore[misc]
    finally:
        gone.set()
        if not task.done():
            await asyncio.wait({task}, timeout=30)


# ---------------------------------------------------------------------- router

class PacerRequestRouter(RequestRouter):
    """Ray Serve's request-router interface over pacer's pure-Python routers."""

    def initialize_state(self, router: str = "least-loaded", num_replicas: int = 1, pools: str | None = None,
                         inner: str = "least-loaded", balance_abs_threshold: int = 4,
                         balance_rel_threshold: float = 1.5, block_size: int = 16) -> None:
        self._router = make_router(router, num_replicas, pools, inner, balance_abs_threshold, balance_rel_threshold)
        self._index = BlockIndex()
        self._lock = threading.Lock()
        self._cluster = Cluster([], {}, self._index, block_size)
        self._in_flight: dict[str, int] = {}
        self._request_replica: dict[str, str] = {}
        self._subscribed: dict[str, str] = {}        # replica id -> endpoint it is subscribed to
        self._subscribers: dict[str, Any] = {}
        self._stop = threading.Event()
        self._sync_lock = threading.Lock()
        self._thread = threading.Thread(target=self._consume_events, name="pacer-kv-subscriber", daemon=True)
        self._thread.start()

    def _sync_replicas(self, replicas: list[RunningReplica]) -> list[str]:
        """The replicas' latest routing stats into LIVE_STATS (the ingress's /metrics reads them)
        and a KV event subscription per replica; called per routed request and every second."""
        with self._sync_lock:
            return self._sync_replicas_locked(replicas)

    def _sync_replicas_locked(self, replicas: list[RunningReplica]) -> list[str]:
        from pacer.telemetry.kv_events import KVEventSubscriber, connect_address

        ids = []
        live = live_stats()
        for r in replicas:
            rid = r.replica_id.unique_id
            ids.append(rid)
            stats = r.routing_stats or {}
            live[rid] = stats
            endpoint = stats.get("kv_endpoint")
            if endpoint and self._subscribed.get(rid) != endpoint:
                replay = stats.get("kv_replay_endpoint")
                sub = KVEventSubscriber(connect_address(endpoint), connect_address(replay) if replay else None,
                                        stats.get("kv_topic", ""))
                with self._lock:
                    self._subscribers[rid] = sub
                    self._index.drop_replica(rid)   # a replaced replica starts from nothing
                self._subscribed[rid] = endpoint
        for gone in set(live) - set(ids):
            live.pop(gone, None)
            with self._lock:
                self._index.drop_replica(gone)
        return ids

    def _consume_events(self) -> None:
        last_sync = 0.0
        while not self._stop.is_set():
            if time.monotonic() - last_sync >= STATS_REFRESH_S:   # fresh /metrics between requests too
                last_sync = time.monotonic()
                self._sync_replicas(list(self.curr_replicas.values()))
            with self._lock:
                subs = list(self._subscribers.items())
            if not subs:
                self._stop.wait(0.2)
                continue
            for rid, sub in subs:
                for _, batch in sub.poll(20):
                    with self._lock:
                        self._index.apply(rid, from_wire(batch))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        ids = self._sync_replicas(candidate_replicas)
        route = pending_request.args[0] if pending_request is not None and pending_request.args else None
        if not isinstance(route, dict):
            return [candidate_replicas]
        live = live_stats()
        self._cluster.replica_ids = sorted(ids, key=lambda rid: (live.get(rid, {}).get("rank", 0), rid))
        self._cluster.load = {rid: self._in_flight.get(rid, 0) for rid in ids}
        req = RouteRequest(route["request_id"], route.get("token_ids", []), route.get("tenant", "default"),
                           route.get("owner", ""), route.get("request_class", "chat"), route.get("session"))
        with self._lock:
            choice = self._router.choose(req, self._cluster)
        by_id = dict(zip(ids, candidate_replicas, strict=True))
        rest = [r for rid, r in by_id.items() if rid != choice]
        return [[by_id[choice]], rest] if rest else [[by_id[choice]]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: Any, result: Any) -> None:
        rid = replica_id.unique_id
        self._in_flight[rid] = self._in_flight.get(rid, 0) + 1
        self._request_replica[pending_request.metadata.internal_request_id] = rid

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        rid = self._request_replica.pop(internal_request_id, replica_id.unique_id)
        self._in_flight[rid] = max(0, self._in_flight.get(rid, 0) - 1)


def aggregate_metrics(stats: dict[str, dict[str, Any]]) -> str:
    """Every replica's Prometheus text with a `replica` label added (HELP/TYPE once)."""
    seen: set[str] = set()
    lines: list[str] = []
    for rid, s in sorted(stats.items(), key=lambda kv: kv[1].get("rank", 0)):
        label = f'replica="{s.get("rank", rid)}"'
        for line in str(s.get("metrics", "")).splitlines():
            if line.startswith("#"):
                if line not in seen:
                    seen.add(line)
                    lines.append(line)
            elif "{" in line:
                name, rest = line.split("{", 1)
                lines.append(f"{name}{{{label},{rest}")
            elif line.strip():
                name, value = line.split(" ", 1)
                lines.append(f"{name}{{{label}}} {value}")
    return "\n".join(lines) + "\n"


def route_meta(body: Any, token_ids: list[int], tenant: str, owner: str, request_class: str,
               request_id: str) -> dict[str, Any]:
    return {"request_id": request_id, "token_ids": token_ids, "tenant": tenant, "owner": owner,
            "request_class": request_class, "stream": bool(isinstance(body, dict) and body.get("stream"))}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()
