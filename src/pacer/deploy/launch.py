"""Start `pacer serve --replicas N` on Ray Serve: locally (Ray started here) or joining an
existing cluster (`--ray-address`). The replicas run this checkout's pacer (its source
directory goes into the Ray runtime environment) with one torch thread each by default.

Keys are resolved here, in the driver (`--api-key`, `--api-keys FILE`, `PACER_API_KEY` /
`VLLM_API_KEY`, `--metrics-api-key`), and reach the ingress and the replicas only as digests
(`pacer.server.access.wire`): no key in clear is in the deployment's config, and a replica
never reads a key from its own environment. The ingress enforces the keys' rate and
concurrency limits once; the replicas get the keys without them."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["build_app", "run_replicas", "check_replica_args", "deployment_args"]

KEY_FLAGS = ("api_key", "api_keys", "metrics_api_key")   # resolved in the driver, never shipped in clear


def check_replica_args(args: argparse.Namespace) -> None:
    from pacer.deploy.options import router_from_args

    router_from_args(args)   # validates --replicas, --router, --router-pools, thresholds
    if args.port < 0 or args.port > 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")


def deployment_args(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the ingress's serve args, the replicas'): the flags with the keys resolved here and
    replaced by their digests; the replicas' keys carry no rate or concurrency limits (the
    ingress enforces those once)."""
    from pacer.server.access.wire import access_to_wire, without_limits
    from pacer.server.cli import build_access, security_choices

    access, weights = build_access(args)
    for line in security_choices(args, access).notices:
        print(line, file=sys.stderr)
    wire = access_to_wire(access, weights)
    serve_args = {k: v for k, v in vars(args).items() if not callable(v) and k not in KEY_FLAGS}
    serve_args.update(dict.fromkeys(KEY_FLAGS), access_wire=wire)
    if serve_args.get("num_threads") is None:
        serve_args["num_threads"] = 1
    return serve_args, {**serve_args, "access_wire": without_limits(wire)}


def build_app(args: argparse.Namespace) -> Any:
    """The Ray Serve application: ingress -> N replicas with pacer's request router."""
    from ray.serve.config import RequestRouterConfig

    from pacer.deploy.ingress import PacerIngress
    from pacer.deploy.ray_app import PacerReplica, PacerRequestRouter

    check_replica_args(args)
    ingress_args, replica_args = deployment_args(args)
    router_config = RequestRouterConfig(
        request_router_class=PacerRequestRouter,
        request_router_kwargs={"router": args.router, "num_replicas": args.replicas, "pools": args.router_pools,
                               "inner": args.router_inner, "balance_abs_threshold": args.balance_abs_threshold,
                               "balance_rel_threshold": args.balance_rel_threshold,
                               "block_size": args.block_size or 16},
        request_routing_stats_period_s=1.0, request_routing_stats_timeout_s=10.0)
    replicas = PacerReplica.options(num_replicas=args.replicas, request_router_config=router_config,
                                    max_ongoing_requests=10_000,
                                    ray_actor_options={"num_cpus": 0}).bind(replica_args)
    return PacerIngress.options(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000).bind(replicas,
                                                                                                     ingress_args)


def start_ray(address: str | None) -> None:
    import ray

    import pacer

    src = str(Path(pacer.__file__).resolve().parents[1])
    env = {"PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "OMP_NUM_THREADS": "1"}
    for key in ("PACER_CACHE_DIR", "PACER_TUNE_MALLOC"):
        if key in os.environ:
            env[key] = os.environ[key]
    ray.init(address=address, runtime_env={"env_vars": env}, include_dashboard=False,
             logging_level="warning", configure_logging=True)


def run_replicas(args: argparse.Namespace) -> int:
    from ray import serve

    from pacer.server.cli import build_access

    check_replica_args(args)
    build_access(args)   # a bad key flag or keys file fails here, before Ray starts
    start_ray(args.ray_address)
    serve.start(http_options={"host": args.host, "port": args.port})
    serve.run(build_app(args), name="pacer", route_prefix="/")
    print(f"[pacer] {args.replicas} replicas behind router {args.router!r} on http://{args.host}:{args.port}/v1 "
          f"(Ray Serve{' at ' + args.ray_address if args.ray_address else ', local'})", file=sys.stderr)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    return 0
