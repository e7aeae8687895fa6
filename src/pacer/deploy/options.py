"""The replica and router flags `pacer serve` and `pacer sim` share (one definition)."""

from __future__ import annotations

import argparse

from pacer.deploy.routers import ROUTERS, Router, make_router

__all__ = ["add_router_args", "router_from_args", "check_replicas"]


def add_router_args(p: argparse.ArgumentParser, default_replicas: int = 1, serve: bool = False) -> None:
    """The replica and router flags; `serve`: also where the Ray cluster is."""
    g = p.add_argument_group("replicas and routing")
    if serve:
        g.add_argument("--ray-address", default=None,
                       help="with --replicas: join this Ray cluster (e.g. ray://head:10001 or auto); "
                            "default: start Ray on this machine")
    g.add_argument("--replicas", type=int, default=default_replicas,
                   help="engine replicas behind one router (serve: Ray Serve replicas; sim: simulated engines)")
    g.add_argument("--router", default="least-loaded", choices=ROUTERS,
                   help="round-robin | least-loaded (waiting + running) | prefix (longest cached prefix from "
                        "the replicas' KV events, bounded imbalance) | class (a pool per request class)")
    g.add_argument("--router-pools", default=None, metavar="CLASS=N,...",
                   help="--router class: replicas per class, taken from the last (default long_context=N/4)")
    g.add_argument("--router-inner", default="least-loaded", choices=[r for r in ROUTERS if r != "class"],
                   help="--router class: how each pool routes")
    g.add_argument("--balance-abs-threshold", type=int, default=4,
                   help="--router prefix: go least-loaded when the best replica has more than this many "
                        "requests above the least-loaded one ...")
    g.add_argument("--balance-rel-threshold", type=float, default=1.5,
                   help="... and more than this many times its load")


def check_replicas(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--replicas must be an integer >= 1, got {n!r}")


def router_from_args(args: argparse.Namespace) -> Router:
    check_replicas(args.replicas)
    return make_router(args.router, args.replicas, pools=args.router_pools, inner=args.router_inner,
                       balance_abs_threshold=args.balance_abs_threshold,
                       balance_rel_threshold=args.balance_rel_threshold)
