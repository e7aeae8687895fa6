"""KV cache events in vLLM's wire format: `--kv-events-config`, a ZMQ publisher, a subscriber.

What routers outside pacer read (llm-d's precise prefix scorer, Dynamo's KV router, Ray
Serve's KV-aware router, AIBrix): msgpack `KVEventBatch` frames of `BlockStored` /
`BlockRemoved` / `AllBlocksCleared` on a ZMQ PUB socket, each sent as the multipart message
(topic, 8-byte big-endian sequence number, payload), and a ROUTER socket that answers a
request carrying a start sequence number with every buffered batch from there on, then an
end marker (sequence -1). The structs below mirror the schema of vLLM's
`vllm/distributed/kv_events.py` field for field, so vLLM's own decoder reads our frames
(tests check that with vLLM's classes when its venv is present).

The events come from the prefix cache's own store/remove points (`pacer.kv.events`):
the engine hands each step's events to `KVEventPublisher.publish`, which encodes and sends
them from its own thread, so the engine never waits on a socket.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import msgspec
import zmq

from pacer.kv.events import AllBlocksClearedEvent, BlockEvent, BlockRemovedEvent, BlockStoredEvent

__all__ = ["KVEventsConfig", "parse_kv_events_config", "KVEventPublisher", "KVEventSubscriber",
           "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch", "to_wire", "offset_endpoint",
           "connect_address", "MEDIUM_GPU", "END_SEQ"]

MEDIUM_GPU = "GPU"
END_SEQ = -1


# ---------------------------------------------------------------------- config

@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """vLLM's `KVEventsConfig` fields and defaults (`--kv-events-config` takes them as JSON)."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None          # "zmq" | "null"; default: zmq when events are enabled
    endpoint: str = "tcp://*:5557"        # PUB socket
    replay_endpoint: str | None = None    # ROUTER socket for missed batches
    buffer_steps: int = 10_000            # batches kept for replay
    hwm: int = 100_000                    # ZMQ high-water mark of the PUB socket
    max_queue_size: int = 100_000         # batches waiting for the publisher thread
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"


_TYPES: dict[str, tuple[type, ...]] = {
    "enable_kv_cache_events": (bool,), "publisher": (str, type(None)), "endpoint": (str,),
    "replay_endpoint": (str, type(None)), "buffer_steps": (int,), "hwm": (int,), "max_queue_size": (int,),
    "topic": (str,),
}


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
    known = [f.name for f in fields(KVEventsConfig)]
    for key, v in value.items():
        if key not in _TYPES:
            raise ValueError(f"--kv-events-config: unknown key {key!r}; known keys: {', '.join(known)}")
        ok = _TYPES[key]
        if not isinstance(v, ok) or (bool not in ok and isinstance(v, bool)):
            raise ValueError(f"--kv-events-config: {key} must be {' or '.join(t.__name__ for t in ok)}, got {v!r}")
    config = KVEventsConfig(**dict(value))
    if config.publisher is None:
        config = replace(config, publisher="zmq" if config.enable_kv_cache_events else "null")
    if config.publisher not in ("zmq", "null"):
        raise ValueError(f"--kv-events-config: publisher must be 'zmq' or 'null', got {config.publisher!r}")
    for key in ("buffer_steps", "hwm", "max_queue_size"):
        if getattr(config, key) < 1:
            raise ValueError(f"--kv-events-config: {key} must be >= 1, got {getattr(config, key)}")
    for key in ("endpoint", "replay_endpoint"):
        ep = getattr(config, key)
        if ep is not None and not ep.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"--kv-events-config: {key} must be a tcp://, ipc:// or inproc:// address, got {ep!r}")
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


def connect_address(endpoint: str, host: str = "127.0.0.1") -> str:
    """Where a subscriber connects for a bound address (`tcp://*:5557` -> tcp://host:5557)."""
    return endpoint.replace("tcp://*:", f"tcp://{host}:").replace("tcp://0.0.0.0:", f"tcp://{host}:")


# ---------------------------------------------------------------------- wire schema (vLLM's)

class _KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None   # one entry per block: its namespace keys


class BlockRemoved(_KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(_KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def to_wire(events: Iterable[BlockEvent], ts: float, rank: int | None = None) -> KVEventBatch:
    out: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
    for e in events:
        if isinstance(e, BlockStoredEvent):
            keys: list[tuple[Any, ...] | None] | None = (
                None if e.extra_keys is None else [e.extra_keys] * len(e.block_hashes))
            out.append(BlockStored(list(e.block_hashes), e.parent_block_hash, list(e.token_ids), e.block_size,
                                   None, e.medium, None, keys))
        elif isinstance(e, BlockRemovedEvent):
            out.append(BlockRemoved(list(e.block_hashes), e.medium))
        elif isinstance(e, AllBlocksClearedEvent):
            out.append(AllBlocksCleared())
    return KVEventBatch(ts, out, rank)


# ---------------------------------------------------------------------- publisher

class KVEventPublisher:
    """PUB + ROUTER (replay) sockets owned by one background thread.

    The PUB socket binds or connects by vLLM's rule (`is_bind_endpoint`); the replay socket
    always binds. Binding happens in that thread before the constructor returns, so a port in use is a
    `ValueError` naming the key and the address. The first batch (sequence 0) is
    `AllBlocksCleared`: a consumer that knew an earlier life of this replica drops it.
    """

    def __init__(self, config: KVEventsConfig, replica_index: int = 0) -> None:
        if not config.enabled:
            raise ValueError("KVEventPublisher needs enable_kv_cache_events=true and publisher='zmq'")
        self.config = config
        self.replica_index = replica_index
        self.endpoint = offset_endpoint(config.endpoint, replica_index) or config.endpoint
        self.replay_endpoint = offset_endpoint(config.replay_endpoint, replica_index)
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._encoder = msgspec.msgpack.Encoder()
        self._topic = config.topic.encode()
        self.num_published = 0
        self.num_dropped = 0
        started: queue.Queue[BaseException | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, args=(started,), name="pacer-kv-events", daemon=True)
        self._thread.start()
        error = started.get()
        if error is not None:
            self._thread.join()
            raise error
        self.publish(0.0, [AllBlocksClearedEvent()])

    def publish(self, ts: float, events: list[BlockEvent]) -> None:
        """Queue one step's events (never blocks the engine: a full queue drops the batch and counts it)."""
        try:
            self._queue.put_nowait(to_wire(events, ts, self.replica_index))
        except queue.Full:
            self.num_dropped += 1

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _bind(self, ctx: zmq.Context[Any]) -> tuple[zmq.Socket[Any], zmq.Socket[Any] | None]:
        pub = ctx.socket(zmq.PUB)
        pub.set_hwm(self.config.hwm)
        sockets: list[tuple[str, str, zmq.Socket[Any]]] = [("endpoint", self.endpoint, pub)]
        replay = None
        if self.replay_endpoint is not None:
            replay = ctx.socket(zmq.ROUTER)
            sockets.append(("replay_endpoint", self.replay_endpoint, replay))
        for key, address, sock in sockets:
            try:
                if key == "endpoint" and not is_bind_endpoint(address):
                    sock.connect(address)   # e.g. llm-d's EPP binds and the model servers connect
                    continue
                sock.bind(address)
            except zmq.ZMQError as e:
                for _, _, s in sockets:
                    s.close(linger=0)
                raise ValueError(f"--kv-events-config: cannot bind {key} {address}: {e.strerror} "
                                 f"(replica {self.replica_index}; pick another port)") from None
            bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            if key == "endpoint":
                self.endpoint = bound
            else:
                self.replay_endpoint = bound
        return pub, replay

    def _run(self, started: queue.Queue[BaseException | None]) -> None:
        ctx: zmq.Context[Any] = zmq.Context.instance()
        try:
            pub, replay = self._bind(ctx)
        except BaseException as e:   # handed to the constructor, which raises it
            started.put(e)
            return
        started.put(None)
        seq = 0
        try:
            while True:
                if replay is not None:
                    while replay.poll(0):
                        self._serve_replay(replay)
                try:
                    batch = self._queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                if batch is None:
                    break
                payload = self._encoder.encode(batch)
                pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
                self._buffer.append((seq, payload))
                seq += 1
                self.num_published += 1
        finally:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)

    def _serve_replay(self, replay: zmq.Socket[Any]) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            return   # not a replay request (client id, empty delimiter, 8-byte start)
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        replay.send_multipart((client, b"", b"", END_SEQ.to_bytes(8, "big", signed=True), b""))


# ---------------------------------------------------------------------- subscriber

class KVEventSubscriber:
    """SUB socket for the live stream, DEALER for replay; `poll()` returns batches in
    sequence order, asking the replay socket for any it missed (a gap in the numbers)."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "") -> None:
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.connect(connect_address(endpoint))
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._replay: zmq.Socket[Any] | None = None
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.DEALER)
            self._replay.connect(connect_address(replay_endpoint))
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.next_seq = 0
        self.num_replayed = 0

    def poll(self, timeout_ms: int = 100) -> list[tuple[int, KVEventBatch]]:
        out: list[tuple[int, KVEventBatch]] = []
        if not self._sub.poll(timeout_ms):
            return out
        while self._sub.poll(0):
            _, seq_bytes, payload = self._sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            if seq < self.next_seq:
                continue
            if seq > self.next_seq:
                out.extend(self.replay(self.next_seq, until=seq))
            out.append((seq, self._decoder.decode(payload)))
            self.next_seq = seq + 1
        return out

    def replay(self, start: int, until: int | None = None, timeout_ms: int = 5000) -> list[tuple[int, KVEventBatch]]:
        """Batches start.. (before `until`) from the publisher's buffer; [] without a replay socket."""
        if self._replay is None:
            return []
        self._replay.send_multipart((b"", start.to_bytes(8, "big")))
        got: list[tuple[int, KVEventBatch]] = []
        while self._replay.poll(timeout_ms):
            _, _, seq_bytes, payload = self._replay.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == END_SEQ:
                break
            if until is None or seq < until:
                got.append((seq, self._decoder.decode(payload)))
        self.num_replayed += len(got)
        if got:
            self.next_seq = max(self.next_seq, got[-1][0] + 1)
        return got

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)
