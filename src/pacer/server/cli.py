"""`pacer serve`: the OpenAI-compatible server on uvicorn (listed in `pacer.cli.SUBCOMMANDS`).

SIGTERM / Ctrl-C: stop accepting connections, let in-flight requests finish for up to
`--drain-timeout` seconds, then cancel (abort) what is left and exit.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from pacer.engine_args import add_engine_args, engine_kwargs_from_args

__all__ = ["add_serve_args", "run_serve", "build_service", "DEFAULT_MODEL_NAME"]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def add_serve_args(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    s.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) clients use; default: --model, or SmolLM2-135M-Instruct")
    s.add_argument("--max-waiting", type=int, default=None,
                   help="cap on requests waiting for their first token; past it: 429 (default: no cap)")
    s.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds to let in-flight requests finish on SIGTERM before aborting them")
    s.add_argument("--metrics-prefix", default="pacer",
                   help="Prometheus name prefix: 'pacer' (pacer_*) or 'vllm' (vLLM's vllm:* names)")
    s.add_argument("--request-log", default=None, metavar="FILE.jsonl",
                   help="append one JSON line per finished request (schema: pacer.metrics)")
    s.add_argument("--long-context-threshold", type=int, default=2048,
                   help="request class long_context: prompts longer than this many tokens")
    s.add_argument("--batch-max-tokens", type=int, default=1024,
                   help="request class batch: requested max_tokens at or above this")
    s.add_argument("--agent-header", default="x-pacer-agent",
                   help="request class agent: requests with this HTTP header (or with tools)")
    s.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    s.add_argument("--prewarm", default=None, metavar="FILE",
                   help="compute these prefixes at start-up and pin them in the prefix cache (public to all "
                        "tenants): a JSON list or JSONL file whose items are text, token ids, "
                        '{"prompt": text} or {"messages": [...]} (rendered without a generation prompt)')
    add_engine_args(p)


def load_prewarm_file(path: str, tokenizer: Any) -> list[Any]:
    """Prompts from a --prewarm file: a JSON list, or one JSON value per line."""
    import json

    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"--prewarm {path}: the file is empty")
    try:
        items = json.loads(stripped) if stripped.startswith("[") else None
    except json.JSONDecodeError:
        items = None
    if not isinstance(items, list) or (items and isinstance(items[0], int)):
        try:
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise ValueError(f"--prewarm {path}: line {e.lineno} is not JSON ({e.msg})") from None
    prompts: list[Any] = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and "messages" in item:
            if tokenizer is None:
                raise ValueError(f"--prewarm {path}: item {i} has messages but the model has no chat template")
            prompts.append(tokenizer.apply_chat_template(item["messages"], add_generation_prompt=False))
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(item["prompt"])
        elif isinstance(item, str) or (isinstance(item, list) and all(isinstance(t, int) for t in item)):
            prompts.append(item)
        else:
            raise ValueError(f"--prewarm {path}: item {i} must be text, token ids, {{'prompt': ...}} or "
                             f"{{'messages': [...]}}, got {type(item).__name__}")
    return prompts


def build_service(args: argparse.Namespace, engine: Any = None) -> Any:
    """The Service for parsed `serve` args; builds the engine unless one is given (tests)."""
    from pacer.engine import Engine
    from pacer.metrics import ClassRules
    from pacer.server.service import Service, ServiceOptions

    if args.port < 0 or args.port > 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_waiting is not None and args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be >= 1 (omit it for no cap), got {args.max_waiting}")
    if args.drain_timeout < 0:
        raise ValueError(f"--drain-timeout must be >= 0, got {args.drain_timeout}")
    rules = ClassRules(args.long_context_threshold, args.batch_max_tokens, args.agent_header.lower())
    names = tuple(args.served_model_name or [getattr(args, "model", None) or DEFAULT_MODEL_NAME])
    options = ServiceOptions(served_model_names=names, max_waiting=args.max_waiting,
                             metrics_prefix=args.metrics_prefix, request_log=args.request_log,
                             class_rules=rules)
    if engine is None:
        engine = Engine.from_kwargs(**engine_kwargs_from_args(args))
    if getattr(args, "prewarm", None):
        cached = engine.prewarm(load_prewarm_file(args.prewarm, engine.tokenizer), public=True)
        print(f"[pacer] prewarmed {len(cached)} prefixes ({sum(cached)} cached tokens, pinned)", file=sys.stderr)
    return Service(engine, options)


def run_serve(args: argparse.Namespace) -> int:
    import prometheus_client
    import uvicorn

    from pacer.server.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    service = build_service(args)
    app = create_app(service)
    print(f"[pacer] serving {service.model_name} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=max(args.drain_timeout, 0.001))
    return 0

