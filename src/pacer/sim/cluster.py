"""N real engines on one virtual timeline behind one router: `pacer sim --replicas N --router NAME`.

Each replica is the real `Engine` with a `SimExecutor` and its own `VirtualClock` (its
device's time). The loop is a discrete-event simulation over one timeline: the next event
is either the next arrival or the step of the replica whose clock is earliest among those
with work. An arrival is routed by `pacer.deploy.routers` (the same code the Ray Serve
deployment runs) on what the router would know at that moment: each replica's waiting +
running count and its KV events, which every engine publishes after each step into the
router's `BlockIndex` (in process; no sockets). A replica that was idle joins the timeline
at the arrival time; a busy one takes the request at its next step, as a real one would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pacer.clock import VirtualClock
from pacer.config import EngineConfig
from pacer.deploy.kv_index import BlockIndex
from pacer.deploy.routers import Cluster, Router, RouteRequest, request_namespace
from pacer.engine import Engine
from pacer.kv.events import BlockEvent
from pacer.request import SamplingParams
from pacer.sim.executor import SimExecutor
from pacer.sim.simulator import TraceRequest, build_sim_engine
from pacer.workload.drive import ClientSlots
from pacer.workload.report import RequestRecord

__all__ = ["Replica", "ClusterResult", "build_cluster", "simulate_cluster"]


@dataclass(slots=True)
class Replica:
    replica_id: str
    engine: Engine
    executor: SimExecutor
    clock: VirtualClock
    num_routed: int = 0


@dataclass(slots=True)
class ClusterResult:
    records: list[RequestRecord]            # in trace order
    replica_of: dict[str, str]              # request id -> replica id
    sim_duration_s: float
    wall_s: float
    replicas: list[Replica]
    extra: dict[str, Any] = field(default_factory=dict)

    def load_split(self) -> list[float]:
        total = sum(r.num_routed for r in self.replicas) or 1
        return [r.num_routed / total for r in self.replicas]

    def hit_rate(self) -> float:
        snaps = [r.engine.snapshot() for r in self.replicas]
        queried = sum(s.prefix_cache_queried_tokens for s in snaps)
        hits = sum(s.prefix_cache_hit_tokens for s in snaps)
        return hits / queried if queried else 0.0


def _index_sink(index: BlockIndex, replica_id: str) -> Callable[[float, list[BlockEvent]], None]:
    def sink(now: float, events: list[BlockEvent]) -> None:
        index.apply(replica_id, events)
    return sink


def build_cluster(num_replicas: int, config: EngineConfig, hw: Any, model: Any, index: BlockIndex,
                  **engine_kwargs: Any) -> list[Replica]:
    """N simulated engines, each publishing its KV events into `index` under its replica id."""
    if num_replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {num_replicas}")
    replicas = []
    for i in range(num_replicas):
        engine, executor, clock = build_sim_engine(config, hw, model, keep_records=False, **engine_kwargs)
        rid = f"replica-{i}"
        if engine.snapshot().prefix_caching:
            engine.add_kv_event_sink(_index_sink(index, rid))
        replicas.append(Replica(rid, engine, executor, clock))
    return replicas


def simulate_cluster(replicas: Sequence[Replica], router: Router, index: BlockIndex,
                     requests: Sequence[TraceRequest], *, block_size: int, isolation: str = "shared",
                     concurrency: int | None = None) -> ClusterResult:
    """Each request is sent at its `arrival_time` (None: at the start), and, with `concurrency`,
    not before one of the deployment's `concurrency` in-flight requests has finished: requests
    without an arrival time then make a closed loop of that many clients (`--concurrency`)."""
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
    return _ClusterLoop(replicas, router, index, requests, block_size, isolation, concurrency).run()


class _ClusterLoop:
    def __init__(self, replicas: Sequence[Replica], router: Router, index: BlockIndex,
                 requests: Sequence[TraceRequest], block_size: int, isolation: str,
                 concurrency: int | None = None) -> None:
        self.replicas = list(replicas)
        self.by_id = {r.replica_id: r for r in replicas}
        self.router = router
        self.requests = requests
        self.isolation = isolation
        self.cluster = Cluster([r.replica_id for r in replicas], {}, index, block_size)
        self.t0 = min((r.clock.now() for r in replicas), default=0.0)
        self.order = sorted(range(len(requests)), key=lambda i: ((requests[i].arrival_time or 0.0), i))
        self.records: list[RequestRecord | None] = [None] * len(requests)
        self.index_of: dict[str, int] = {}
        self.replica_of: dict[str, str] = {}
        self.idle: dict[str, int] = {}
        self.nxt = 0
        self.slots = ClientSlots(concurrency, self.t0)   # the drivers' rule: sent when a slot frees

    def _next_arrival(self) -> float:
        free = self.slots.next_free()
        if self.nxt >= len(self.order) or free is None:
            return float("inf")
        return max(self.t0 + (self.requests[self.order[self.nxt]].arrival_time or 0.0), free)

    def run(self) -> ClusterResult:
        wall0 = time.perf_counter()
        while self.nxt < len(self.order) or any(r.engine.has_unfinished_requests() for r in self.replicas):
            busy = [r for r in self.replicas if r.engine.has_unfinished_requests()]
            step_at = min((r.clock.now() for r in busy), default=float("inf"))
            if self._next_arrival() <= step_at:
                self._arrive()
            else:
                self._step(min(busy, key=lambda r: (r.clock.now(), r.replica_id)), busy)
        end = max((r.clock.now() for r in self.replicas), default=self.t0)
        done = [r for r in self.records if r is not None]
        return ClusterResult(done, self.replica_of, end - self.t0, time.perf_counter() - wall0, self.replicas)

    def _arrive(self) -> None:
        arrive_at = self._next_arrival()
        self.slots.take()
        i = self.order[self.nxt]
        self.nxt += 1
        req = self.requests[i]
        for r in self.replicas:
            snap = r.engine.snapshot()
            self.cluster.load[r.replica_id] = snap.num_waiting + snap.num_running
        owner = request_namespace(req.tenant, None, self.isolation)
        route = RouteRequest(req.request_id, req.prompt_token_ids, req.tenant, owner, req.request_class, req.session)
        choice = self.by_id[self.router.choose(route, self.cluster)]
        if not choice.engine.has_unfinished_requests() and choice.clock.now() < arrive_at:
            choice.clock.set(arrive_at)   # an idle replica joins the timeline at the arrival
        params = SamplingParams(max_tokens=req.output_tokens, ignore_eos=True, temperature=0.0)
        rid = choice.engine.add_request(req.prompt_token_ids, params, request_id=f"sim-{i}", priority=req.priority,
                                        tenant=req.tenant, arrival_time=arrive_at, session=req.session,
                                        segments=getattr(req, "segments", None) or None)
        self.index_of[rid] = i
        self.replica_of[req.request_id] = choice.replica_id
        choice.num_routed += 1

    def _step(self, replica: Replica, busy: list[Replica]) -> None:
        before = replica.clock.now()
        for out in replica.engine.step():
            if out.finished:
                self.slots.release(replica.clock.now())
                i = self.index_of.pop(out.request_id)
                r = self.requests[i]
                self.records[i] = RequestRecord.from_metrics(out.metrics, request_id=r.request_id,
                                                             request_class=r.request_class, t0=self.t0,
                                                             tenant=r.tenant, priority=r.priority)
        rid = replica.replica_id
        self.idle[rid] = self.idle.get(rid, 0) + 1 if replica.clock.now() == before else 0
        if self.idle[rid] > 3 and replica.engine.has_unfinished_requests():
            # nothing runs (admission only): move this replica to the next event so the loop progresses
            self.idle[rid] = 0
            later = [t for t in (self._next_arrival(), *(r.clock.now() for r in busy)) if before < t < float("inf")]
            if not later:
                raise RuntimeError(f"simulation stalled on {rid} at t={before:.3f}s")
            replica.clock.set(min(later))


def run_cluster_cli(args: Any, config: EngineConfig, hw: Any, model: Any, rates: Sequence[float | None],
                    slo: Any, make_specs: Any, print_report: Any, make_meta: Any) -> int:
    """`pacer sim --replicas N --router NAME`: one cluster run per rate, pacer bench's report,
    plus the routing figures (hit rate, load split)."""
    from pacer.deploy.options import router_from_args
    from pacer.workload.report import build_report

    for rate in rates:
        router = router_from_args(args)   # a fresh router (and its rotation) per run
        index = BlockIndex()
        replicas = build_cluster(args.replicas, config, hw, model, index, tp=args.tp,
                                 gpu_memory_utilization=args.gpu_memory_utilization)
        specs, workload, arrivals = make_specs(rate, replicas[0].engine.max_model_len)
        result = simulate_cluster(replicas, router, index, specs, block_size=config.cache.block_size,
                                  isolation=config.cache.tenant_isolation, concurrency=args.concurrency)
        meta = make_meta(workload, arrivals, rate, len(specs))
        meta.update({"model": model.name, "replicas": args.replicas, "router": args.router,
                     "load_split": result.load_split(), "prefix_cache_hit_rate": result.hit_rate()})
        report = build_report(result.records, slo=slo, meta=meta)
        print_report(report, f"pacer sim: {args.replicas} x {model.name} on {hw.name} x{args.tp}, router "
                             f"{args.router}, {workload}, {arrivals}")
        split = "/".join(f"{x * 100:.0f}" for x in result.load_split())
        print(f"router {args.router}: prefix-cache hit rate {result.hit_rate():.3f}, load split {split} (%), "
              f"simulated {result.sim_duration_s:.1f} s in {result.wall_s:.2f} s wall")
        if args.out:
            report.save(args.out if len(rates) == 1 else f"{args.out}.rate-{rate}")
    return 0
