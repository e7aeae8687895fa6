"""One engine over HTTP from the command line: the server's flags (`add_server_args`), the
`Service` they build (`build_service`, also what each Ray Serve replica runs) and `serve`, the
app on uvicorn. `pacer serve` (`pacer.cli.serve`) adds the engine and replica flags and picks
between one engine and replicas.

SIGTERM / Ctrl-C: stop accepting connections, let in-flight requests finish for up to
`--drain-timeout` seconds, then cancel (abort) what is left and exit.

Safe by default, and said at start-up (`security_choices`): keys imply a prefix cache
isolated per tenant unless `--tenant-isolation shared` is given (then a warning says what it
reveals); under keys a trusted key's own SLO targets are no tighter than its class's unless
`--allow-tighter-slo` is given; the waiting queue is capped (`--max-waiting none` lifts the
cap, loudly); a server without keys says that anyone who can reach it may use it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pacer.config.args import engine_kwargs_from_args

__all__ = ["add_server_args", "serve", "build_service", "build_access", "security_choices", "SecurityChoices",
           "DEFAULT_MODEL_NAME", "DEFAULT_MAX_WAITING"]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MAX_WAITING = 512

T = TypeVar("T")


def _cap_or_none(flag: str, kind: type) -> Any:
    """An argparse type: a number > 0, or `none` (no cap / off)."""
    def parse(text: str) -> Any:
        if text.strip().lower() == "none":
            return None
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: expected a number > 0 or 'none', got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{flag}: must be > 0 (or 'none'), got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def add_server_args(p: argparse.ArgumentParser) -> None:
    """The flags of one server: HTTP, request classes, prewarm, KV events; then tools (add_tool_args),
    keys and limits (add_access_args)."""
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    s.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) clients use; default: --model, or SmolLM2-135M-Instruct")
    s.add_argument("--max-waiting", type=_cap_or_none("--max-waiting", int), default=DEFAULT_MAX_WAITING,
                   help=f"cap on requests waiting for their first token; past it: 429 ('none': no cap; "
                        f"default {DEFAULT_MAX_WAITING})")
    s.add_argument("--max-queued-outputs", type=int, default=256,
                   help="outputs a streaming client may leave unread, per choice; past it the request is aborted, "
                        "its KV freed and its stream ends with an error (vLLM bounds its queue at 256; default 256)")
    s.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds to let in-flight requests finish on SIGTERM before aborting them")
    s.add_argument("--engine-iteration-timeout", type=_cap_or_none("--engine-iteration-timeout", float), default=60.0,
                   metavar="SECONDS", help="watchdog: /health is 503 while work is pending and no engine step has "
                                           "finished for this long (vLLM's VLLM_ENGINE_ITERATION_TIMEOUT_S; "
                                           "'none': off; default 60)")
    s.add_argument("--max-tenant-labels", type=int, default=100,
                   help="client-named tenants given their own Prometheus `tenant` label; later ones share "
                        "'other' (tenants of the --api-keys file always have theirs; default 100)")
    s.add_argument("--metrics-prefix", default="pacer",
                   help="Prometheus name prefix: 'pacer' (pacer_*) or 'vllm' (vLLM's vllm:* names)")
    s.add_argument("--request-log", default=None, metavar="FILE.jsonl",
                   help="append one JSON line per finished request (schema: pacer.telemetry.request_log)")
    s.add_argument("--step-log", default=None, metavar="FILE.jsonl",
                   help="append one JSON line per engine step: its batch, wall time and budget "
                        "(schema: pacer.telemetry.step_log)")
    s.add_argument("--rag-threshold", "--long-context-threshold", dest="long_context_threshold", type=int,
                   default=1024, help="request class rag (alias long_context): prompts longer than this many "
                                      "tokens, unless the client names its class (x-pacer-class header)")
    s.add_argument("--batch-max-tokens", type=int, default=384,
                   help="request class batch: requested max_tokens at or above this")
    s.add_argument("--agent-header", default="x-pacer-agent",
                   help="request class agent: requests with this HTTP header (or with tools)")
    s.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="pacer's and uvicorn's log level (default info)")
    s.add_argument("--prewarm", default=None, metavar="FILE",
                   help="compute these prefixes at start-up and pin them in the prefix cache (public to all "
                        "tenants): a JSON list or JSONL file whose items are text, token ids, "
                        '{"prompt": text} or {"messages": [...]} (rendered without a generation prompt)')
    s.add_argument("--kv-events-config", default=None, metavar="JSON",
                   help="publish KV cache events as vLLM does (its KVEventsConfig fields), e.g. "
                        '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
                        '"replay_endpoint": "tcp://*:5558", "topic": "kv"}\'')
    s.add_argument("--enable-per-request-metrics", action="store_true",
                   help="every response carries each choice's metrics (queue wait, TTFT, ITL, TPOT, cached "
                        "tokens, SLO targets, slack at admission, met); else a body's return_metrics asks")
    add_tool_args(p)
    add_access_args(p)


def add_tool_args(p: argparse.ArgumentParser) -> None:
    """Tool calling and the chat template, under vLLM's flag names."""
    t = p.add_argument_group("tools and chat template (vLLM's flags)")
    t.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let the model decide to call tools (tool_choice "auto"); needs --tool-call-parser')
    t.add_argument("--tool-call-parser", default=None, choices=("hermes", "llama3_json"),
                   help="how tool calls are read from the output (and written by forced calls); default for "
                        "forced calls: hermes")
    t.add_argument("--chat-template", default=None, metavar="PATH",
                   help="a Jinja chat template file used instead of the model's for every chat request, or a "
                        "template pacer ships: qwen3 (thinking in <think>, enable_thinking) or chatml_tools "
                        "(default: the model's, or pacer's tool-aware ChatML template when tools are given and "
                        "the model's template has no tool support)")
    t.add_argument("--default-chat-template-kwargs", default=None, metavar="JSON",
                   help='the chat template\'s extra variables for every request, e.g. \'{"enable_thinking": false}\' '
                        "(a request's chat_template_kwargs override them)")


def add_access_args(p: argparse.ArgumentParser) -> None:
    from pacer.server.access.auth import TENANT_HEADER
    from pacer.server.api.limits import LIMIT_FLAGS

    a = p.add_argument_group("API keys and tenants (docs: usage/api-keys.md)")
    a.add_argument("--api-key", nargs="+", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on every route but /health (vLLM's flag; default: "
                        "$PACER_API_KEY, else $VLLM_API_KEY, else open). These keys may name any tenant.")
    a.add_argument("--api-keys", default=None, metavar="FILE",
                   help="YAML/JSON file of named keys (clear or SHA-256) bound to tenants, priority ranges, "
                        "rate limits, concurrency caps and tightest SLO targets; the tenant comes from the key")
    a.add_argument("--metrics-api-key", default=None, metavar="KEY",
                   help="require this key on /metrics and /debug/* (default: /metrics is open, /debug/* needs an "
                        "API key when keys are required)")
    a.add_argument("--tenant-header", default=TENANT_HEADER,
                   help="header in which a gateway key names its client's tenant (llm-d's fairness id)")
    lim = p.add_argument_group("request limits (400/413 naming the field and the limit)")
    for flag, (name, default, help_) in LIMIT_FLAGS.items():
        lim.add_argument(f"--{flag}", dest=name, type=int, default=default, help=f"{help_} (default {default})")


def build_access(args: argparse.Namespace) -> tuple[Any, dict[str, float]]:
    """The Access (key rings) for parsed args, and the keys file's tenant_weights."""
    from pacer.server.access.auth import Access, KeyRing, load_keys_file

    wire = getattr(args, "access_wire", None)
    if wire is not None:   # a replica: the driver resolved the keys and sent their digests
        from pacer.server.access.wire import access_from_wire

        return access_from_wire(wire)
    plain = getattr(args, "api_key", None) or [
        k for k in (os.environ.get("PACER_API_KEY"), os.environ.get("VLLM_API_KEY")) if k][:1]
    if any(not k for k in plain):
        raise ValueError("--api-key must not be empty")
    keys = list(KeyRing.from_plain(plain).keys)
    weights: dict[str, float] = {}
    if getattr(args, "api_keys", None):
        loaded = load_keys_file(args.api_keys)
        keys += loaded.keys
        weights = loaded.tenant_weights
    metrics = KeyRing.from_plain([args.metrics_api_key], "metrics-api-key") if args.metrics_api_key else KeyRing()
    return Access(KeyRing(keys), metrics, bool(getattr(args, "api_keys", None)), args.tenant_header.lower()), weights


@dataclass(frozen=True, slots=True)
class SecurityChoices:
    """What the flags decide about safety, and the start-up lines that say so."""

    tenant_isolation: str | None    # what the engine is built with (None: the config's default)
    floor_trusted_slo: bool         # a trusted key's own SLO targets are no tighter than its class's
    notices: tuple[str, ...]


def security_choices(args: argparse.Namespace, access: Any) -> SecurityChoices:
    """The safe defaults the flags imply, each stated at start-up: keys isolate the prefix cache
    per tenant unless `--tenant-isolation shared` is chosen, and bound trusted keys' SLO targets
    unless `--allow-tighter-slo` is; an operator's opt-out (no keys, no queue cap, no
    watchdog, a shared cache under keys) is a WARNING line."""
    keys = access.api_keys.enabled
    notices: list[str] = []
    chosen = getattr(args, "tenant_isolation", None)
    isolation = chosen
    if keys and chosen is None:
        isolation = "isolated"
        notices.append("[pacer] API keys: tenant isolation 'isolated' (each tenant's prefix cache is its own; "
                       "--tenant-isolation shared to share one)")
    elif keys and chosen == "shared":
        notices.append("[pacer] WARNING: --tenant-isolation shared with API keys: tenants share one prefix cache, so "
                       "a tenant's cached_tokens and TTFT reveal whether another tenant sent the same prompt prefix")
    allow = getattr(args, "allow_tighter_slo", None)
    if keys and allow:
        notices.append("[pacer] --allow-tighter-slo: plain --api-key keys may ask for SLO targets tighter than their "
                       "class's (keys of an --api-keys file stay bounded)")
    if not keys:
        host = getattr(args, "host", "127.0.0.1")
        who = "any local user" if host in ("127.0.0.1", "localhost", "::1") else "anyone who can reach it"
        notices.append(f"[pacer] WARNING: no API key is required: {who} may use every route on {host}:"
                       f"{getattr(args, 'port', '')} and name any tenant (--api-key or --api-keys to require keys)")
    elif not access.metrics_keys.enabled:
        notices.append("[pacer] /metrics needs no key (--metrics-api-key to require one)")
    if getattr(args, "max_waiting", DEFAULT_MAX_WAITING) is None:
        notices.append("[pacer] WARNING: --max-waiting none: the waiting queue has no cap, so a flood of requests "
                       "holds memory without bound")
    if getattr(args, "engine_iteration_timeout", 60.0) is None:
        notices.append("[pacer] WARNING: --engine-iteration-timeout none: /health stays 200 while an engine step is "
                       "stuck")
    return SecurityChoices(isolation, bool(keys) and allow is not True, tuple(notices))


def attach_kv_events(service: Any, config_json: str | None, replica_index: int = 0) -> Any:
    """Start the KV event publisher for `--kv-events-config` (None when not enabled); replica i
    binds the configured ports + i. Closed, and detached from the engine, at shutdown."""
    import time

    from pacer.telemetry.kv_events import KVEventPublisher, parse_kv_events_config

    config = parse_kv_events_config(config_json)
    if not config.enabled:
        return None
    if not service.engine.snapshot().prefix_caching:
        raise ValueError("--kv-events-config needs prefix caching (drop --no-enable-prefix-caching)")
    publisher = KVEventPublisher(config, replica_index)

    def sink(now: float, events: list[Any]) -> None:
        publisher.publish(time.time(), events)

    service.engine.add_kv_event_sink(sink)
    service.kv_publisher = publisher
    def close() -> None:
        service.engine.remove_kv_event_sink(sink)
        publisher.close()

    service.closers.append(close)
    print(f"[pacer] KV events (replica {replica_index}) on {publisher.endpoint}, replay "
          f"{publisher.replay_endpoint or 'off'}, topic {config.topic!r}", file=sys.stderr)
    return publisher


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
    from pacer.config.slo import ClassRules
    from pacer.server.api.limits import RequestLimits
    from pacer.server.service import Service, ServiceOptions
    from pacer.server.tools.serving import ToolOptions
    from pacer.server.tools.template import load_chat_template

    _check_serve_numbers(args)
    rules = ClassRules(args.long_context_threshold, args.batch_max_tokens, args.agent_header.lower())
    names = tuple(args.served_model_name or [getattr(args, "model", None) or DEFAULT_MODEL_NAME])
    access, weights = build_access(args)
    choices = security_choices(args, access)
    limits = RequestLimits.from_args(args)
    template = load_chat_template(args.chat_template) if args.chat_template else None
    tools = ToolOptions(args.enable_auto_tool_choice, args.tool_call_parser, template,
                        _json_object("--default-chat-template-kwargs", getattr(args, "default_chat_template_kwargs", None)))
    from pacer.telemetry.kv_events import parse_kv_events_config

    parse_kv_events_config(getattr(args, "kv_events_config", None))   # a bad config fails before the model loads
    engine, thread = _engine_and_thread(args, choices.tenant_isolation, engine)
    for line in choices.notices:
        print(line, file=sys.stderr)
    if weights and not engine.config.scheduler.fair_tenant_weights:
        engine.scheduler.ledger.set_weights(weights)   # the keys file's shares weigh fair-share service too
    options = ServiceOptions(served_model_names=names, max_waiting=args.max_waiting,
                             metrics_prefix=args.metrics_prefix, request_log=args.request_log,
                             step_log=getattr(args, "step_log", None),
                             class_rules=rules, tools=tools, access=access, limits=limits,
                             tenant_weights=weights or engine.config.cache.tenant_weights,
                             max_queued_outputs=args.max_queued_outputs,
                             engine_iteration_timeout=args.engine_iteration_timeout,
                             floor_trusted_slo=choices.floor_trusted_slo, max_tenant_labels=args.max_tenant_labels,
                             per_request_metrics=getattr(args, "enable_per_request_metrics", False))
    if getattr(args, "prewarm", None):
        from pacer.engine.prewarm import prewarm

        prompts = load_prewarm_file(args.prewarm, engine.tokenizer)
        cached = _on_engine_thread(thread, lambda: prewarm(engine, prompts, public=True))
        print(f"[pacer] prewarmed {len(cached)} prefixes ({sum(cached)} cached tokens, pinned)", file=sys.stderr)
    service = Service(engine, options, thread)
    attach_kv_events(service, getattr(args, "kv_events_config", None))
    return service


def _check_serve_numbers(args: argparse.Namespace) -> None:
    """The server's numeric flags in range (the engine's are checked where its config is built)."""
    if args.port < 0 or args.port > 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_waiting is not None and args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be >= 1 ('none' for no cap), got {args.max_waiting}")
    if args.max_tenant_labels < 0:
        raise ValueError(f"--max-tenant-labels must be >= 0, got {args.max_tenant_labels}")
    if args.max_queued_outputs < 1:
        raise ValueError(f"--max-queued-outputs must be >= 1, got {args.max_queued_outputs}")
    if args.drain_timeout < 0:
        raise ValueError(f"--drain-timeout must be >= 0, got {args.drain_timeout}")


def _engine_and_thread(args: argparse.Namespace, tenant_isolation: str | None, engine: Any) -> tuple[Any, Any]:
    """The engine and the thread that owns it: built on a new `EngineThread`, where it is then
    prewarmed and stepped (pacer.server.engine_thread), or the one given (tests: no thread),
    checked against the isolation the flags ask for."""
    from pacer.engine import Engine
    from pacer.server.engine_thread import EngineThread

    if engine is not None:
        if tenant_isolation not in (None, engine.config.cache.tenant_isolation):
            raise ValueError(f"the engine was built with tenant_isolation={engine.config.cache.tenant_isolation!r} "
                             f"but the flags ask for {tenant_isolation!r} (API keys imply 'isolated'; "
                             "--tenant-isolation shared keeps one shared cache)")
        return engine, None
    kwargs = engine_kwargs_from_args(args)
    if tenant_isolation is not None:
        kwargs["tenant_isolation"] = tenant_isolation
    thread = EngineThread()
    try:
        return thread.call(lambda: Engine.from_kwargs(**kwargs)), thread
    except BaseException:
        thread.close()
        raise


def _on_engine_thread(thread: Any, fn: Callable[[], T]) -> T:
    """`fn()` on the engine's thread (the caller's when the engine came built: tests)."""
    return fn() if thread is None else thread.call(fn)


def _json_object(flag: str, text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object such as '{{\"enable_thinking\": false}}', got {text!r}")
    return value


def serve(args: argparse.Namespace) -> int:
    """Serve one engine on uvicorn until SIGTERM / Ctrl-C (then drain)."""
    import prometheus_client
    import uvicorn

    from pacer.server.app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    service = build_service(args)
    app = create_app(service)
    print(f"[pacer] serving {service.model_name} on http://{args.host}:{args.port}/v1", file=sys.stderr)
    access = service.options.access
    if access.api_keys.enabled:
        print(f"[pacer] every route but /health needs an API key ({len(access.api_keys.keys)} accepted"
              f"{'; tenants come from the keys' if access.binds_tenants else ''})", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=max(args.drain_timeout, 0.001))
    return 0

