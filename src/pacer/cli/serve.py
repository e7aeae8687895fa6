"""`pacer serve`: the OpenAI-compatible server. One engine (`pacer.server.cli.serve`), or with
`--replicas N` (or `--ray-address`, or a router other than the default) N engines as Ray Serve
replicas behind one router (`pacer.deploy.launch`). The decision is made here, so the server
never imports the deployment that runs it."""

from __future__ import annotations

import argparse

from pacer.config.args import add_engine_args
from pacer.deploy.options import add_router_args, check_replicas
from pacer.server.cli import add_server_args

__all__ = ["add_args", "run"]


def add_args(p: argparse.ArgumentParser) -> None:
    """Every `pacer serve` flag: the server's, the replicas' and routers', and the engine's."""
    add_server_args(p)
    add_router_args(p, serve=True)
    add_engine_args(p)


def run(args: argparse.Namespace) -> int:
    check_replicas(args.replicas)
    if args.replicas > 1 or args.ray_address or args.router != "least-loaded":
        from pacer.deploy.launch import run_replicas

        return run_replicas(args)
    from pacer.server.cli import serve

    return serve(args)
