"""`--kv-events-config`: vLLM's `KVEventsConfig` fields plus pacer's safety knobs (pure).

The stream carries the token ids of every tenant's prompts, so the defaults keep it on this
machine: enabled without an `endpoint`, the PUB socket binds loopback only
(`DEFAULT_ENDPOINT`). vLLM's rule for a given endpoint still holds (a wildcard or ipc/inproc
address binds, a host address connects to a consumer that binds); `bind: true` asks for a
bind on a host address (e.g. `tcp://127.0.0.1:5557`, or one interface). Replay is
rate-limited (`replay_rate` requests per second in all, `replay_peer_rate` per peer, each
with a burst of `replay_burst`); `curve_secret_key_file` / `curve_client_keys_dir` turn on
ZMQ CURVE encryption and client authentication (certificate files as
`zmq.auth.create_certificates` writes them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = ["KVEventsConfig", "parse_kv_events_config", "offset_endpoint", "is_bind_endpoint", "connect_address",
           "is_wildcard", "DEFAULT_ENDPOINT"]

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"   # loopback only: the stream holds every tenant's token ids


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's `KVEventsConfig` fields (`--kv-events-config` takes them as JSON), and pacer's
    bind / replay-rate / CURVE knobs."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None          # "zmq" | "null"; default: zmq when events are enabled
    endpoint: str | None = None           # PUB socket; None: bind DEFAULT_ENDPOINT (loopback)
    replay_endpoint: str | None = None    # ROUTER socket for missed batches (always binds)
    buffer_steps: int = 10_000            # batches kept for replay
    hwm: int = 100_000                    # ZMQ high-water mark of the PUB socket
    max_queue_size: int = 100_000         # batches waiting for the publisher thread
    topic: str = ""
    bind: bool | None = None              # None: vLLM's rule (wildcard binds, host connects)
    replay_rate: float = 10.0             # replay requests per second, all peers together
    replay_peer_rate: float = 1.0         # replay requests per second from one peer
    replay_burst: int = 10                # requests a bucket holds when full
    curve_secret_key_file: str | None = None   # server certificate (public + secret key): CURVE on
    curve_client_keys_dir: str | None = None   # public certificates of the clients allowed (else any key)

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"

    @property
    def address(self) -> str:
        return self.endpoint if self.endpoint is not None else DEFAULT_ENDPOINT

    def binds(self, address: str) -> bool:
        """Whether the PUB socket binds `address` (an explicit `bind` wins, then the default
        endpoint binds, then vLLM's rule)."""
        if self.bind is not None:
            return self.bind
        return self.endpoint is None or is_bind_endpoint(address)


_TYPES: dict[str, tuple[type, ...]] = {
    "enable_kv_cache_events": (bool,), "publisher": (str, type(None)), "endpoint": (str, type(None)),
    "replay_endpoint": (str, type(None)), "buffer_steps": (int,), "hwm": (int,), "max_queue_size": (int,),
    "topic": (str,), "bind": (bool, type(None)), "replay_rate": (int, float), "replay_peer_rate": (int, float),
    "replay_burst": (int,), "curve_secret_key_file": (str, type(None)), "curve_client_keys_dir": (str, type(None)),
}


def _check_types(value: Mapping[str, Any]) -> None:
    known = [f.name for f in fields(KVEventsConfig)]
    for key, v in value.items():
        if key not in _TYPES:
            raise ValueError(f"--kv-events-config: unknown key {key!r}; known keys: {', '.join(known)}")
        ok = _TYPES[key]
        if not isinstance(v, ok) or (bool not in ok and isinstance(v, bool)):
            raise ValueError(f"--kv-events-config: {key} must be {' or '.join(t.__name__ for t in ok)}, got {v!r}")


def parse_kv_events_config(value: str | Mapping[str, Any] | None) -> KVEventsConfig:
    """From `--kv-events-config` JSON (or a dict): unknown keys and wrong types are errors
    that name the key, like vLLM's own parser."""
    if value is None:
        return KVEventsConfig()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"--kv-events-config: not valid JSON ({e.msg} at position {e.pos})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"--kv-events-config must be a JSON object, got {type(value).__name__}")
    _check_types(value)
    config = KVEventsConfig(**dict(value))
    if config.publisher is None:
        config = replace(config, publisher="zmq" if config.enable_kv_cache_events else "null")
    if config.publisher not in ("zmq", "null"):
        raise ValueError(f"--kv-events-config: publisher must be 'zmq' or 'null', got {config.publisher!r}")
    for key in ("buffer_steps", "hwm", "max_queue_size", "replay_burst"):
        if getattr(config, key) < 1:
            raise ValueError(f"--kv-events-config: {key} must be >= 1, got {getattr(config, key)}")
    for key in ("replay_rate", "replay_peer_rate"):
        if not getattr(config, key) > 0:
            raise ValueError(f"--kv-events-config: {key} must be > 0 requests per second, got {getattr(config, key)}")
    for key in ("endpoint", "replay_endpoint"):
        ep = getattr(config, key)
        if ep is not None and not ep.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"--kv-events-config: {key} must be a tcp://, ipc:// or inproc:// address, got {ep!r}")
    if config.curve_client_keys_dir is not None and config.curve_secret_key_file is None:
        raise ValueError("--kv-events-config: curve_client_keys_dir needs curve_secret_key_file (the server's key)")
    return config


def offset_endpoint(endpoint: str | None, index: int) -> str | None:
    """Replica `index`'s own address: tcp ports move up by the index (port 0 stays 0: the OS
    picks), other transports get a suffix. The same rule as vLLM's per-DP-rank offset."""
    if endpoint is None or index == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{base}:{int(port) + index}"
    return f"{endpoint}_dp{index}"


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule for the PUB socket: bind a wildcard (`tcp://*:5557`, `::`) or an ipc/inproc
    address, connect to any other (a consumer that binds, as llm-d's EPP can)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def is_wildcard(endpoint: str) -> bool:
    """A tcp address that listens on every interface (other machines can connect)."""
    host = endpoint.removeprefix("tcp://").rpartition(":")[0]
    return endpoint.startswith("tcp://") and host in ("*", "0.0.0.0", "::", "[::]", "[*]")


def connect_address(endpoint: str, host: str = "127.0.0.1") -> str:
    """Where a subscriber connects for a bound address (`tcp://*:5557` -> tcp://host:5557)."""
    return endpoint.replace("tcp://*:", f"tcp://{host}:").replace("tcp://0.0.0.0:", f"tcp://{host}:")
