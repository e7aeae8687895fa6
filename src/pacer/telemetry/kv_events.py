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
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import zmq

from pacer.config.kv_events import (
    DEFAULT_ENDPOINT,
    KVEventsConfig,
    connect_address,
    is_bind_endpoint,
    is_wildcard,
    offset_endpoint,
    parse_kv_events_config,
)
from pacer.kv.events import AllBlocksClearedEvent, BlockEvent, BlockRemovedEvent, BlockStoredEvent

__all__ = ["KVEventsConfig", "parse_kv_events_config", "KVEventPublisher", "KVEventSubscriber",
           "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch", "to_wire", "offset_endpoint",
           "connect_address", "is_bind_endpoint", "MEDIUM_GPU", "END_SEQ", "DEFAULT_ENDPOINT", "TokenBucket",
           "REPLAY_SLICE"]

log = logging.getLogger("pacer.kv_events")

MEDIUM_GPU = "GPU"
END_SEQ = -1
REPLAY_SLICE = 64          # replay frames sent per loop turn, after every queued live batch
MAX_ACTIVE_REPLAYS = 16    # replays in progress at once; more are refused (answered with the end marker)


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

class TokenBucket:
    """`rate` tokens per second up to `burst`; `take()` spends one if there is one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._at = float(burst), clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def _curve_keys(path: str, role: str) -> tuple[bytes, bytes]:
    import zmq.auth

    public, secret = zmq.auth.load_certificate(path)
    if secret is None:
        raise ValueError(f"--kv-events-config: {role} {path} holds no secret key (use the .key_secret file)")
    return public, secret


class KVEventPublisher:
    """PUB + ROUTER (replay) sockets owned by one background thread.

    The PUB socket binds or connects by `KVEventsConfig.binds` (loopback bind by default,
    then vLLM's rule); the replay socket always binds. Binding happens in that thread before
    the constructor returns, so a port in use is a `ValueError` naming the key and the
    address; a wildcard bind logs a warning. The first batch (sequence 0) is
    `AllBlocksCleared`: a consumer that knew an earlier life of this replica drops it.

    Each loop turn publishes every queued live batch first, then admits replay requests
    through a total and a per-peer token bucket (a refused one gets the end marker at once)
    and sends at most `REPLAY_SLICE` replay frames: a replay flood never holds the live
    stream back.
    """

    def __init__(self, config: KVEventsConfig, replica_index: int = 0) -> None:
        if not config.enabled:
            raise ValueError("KVEventPublisher needs enable_kv_cache_events=true and publisher='zmq'")
        self.config = config
        self.replica_index = replica_index
        self.endpoint = offset_endpoint(config.address, replica_index) or config.address
        self.replay_endpoint = offset_endpoint(config.replay_endpoint, replica_index)
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._encoder = msgspec.msgpack.Encoder()
        self._topic = config.topic.encode()
        self._replays: deque[list[Any]] = deque()   # [client id, next sequence] per replay in progress
        self._total = TokenBucket(config.replay_rate, config.replay_burst)
        self._peers: OrderedDict[bytes, TokenBucket] = OrderedDict()
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._auth: Any = None
        self.num_published = 0
        self.num_dropped = 0
        self.num_replays_served = 0
        self.num_replays_refused = 0
        asked = (("endpoint", self.endpoint), ("replay_endpoint", self.replay_endpoint))
        started: queue.Queue[BaseException | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, args=(started,), name="pacer-kv-events", daemon=True)
        self._thread.start()
        error = started.get()
        if error is not None:
            self._thread.join()
            raise error
        for key, address in asked:
            if address is not None and is_wildcard(address) and (key == "replay_endpoint" or config.binds(address)):
                log.warning("KV events %s %s listens on every interface: the stream carries the token ids of every "
                            "tenant's prompts; bind loopback (the default) or set curve_secret_key_file", key, address)
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
        if self._auth is not None:
            self._auth.stop()
            self._ctx.term()

    def _start_auth(self) -> None:
        """CURVE's authenticator on a context of our own (it serves every socket of its context):
        with curve_client_keys_dir only the clients whose public certificates are there get in."""
        import zmq.auth
        from zmq.auth.thread import ThreadAuthenticator

        self._ctx = zmq.Context()
        self._auth = ThreadAuthenticator(self._ctx)
        self._auth.start()
        self._auth.configure_curve(domain="*", location=self.config.curve_client_keys_dir or zmq.auth.CURVE_ALLOW_ANY)

    def _secure(self, sock: zmq.Socket[Any]) -> None:
        assert self.config.curve_secret_key_file is not None
        public, secret = _curve_keys(self.config.curve_secret_key_file, "curve_secret_key_file")
        sock.curve_secretkey, sock.curve_publickey, sock.curve_server = secret, public, True

    def _bind(self) -> tuple[zmq.Socket[Any], zmq.Socket[Any] | None]:
        if self.config.curve_secret_key_file is not None:
            self._start_auth()
        ctx = self._ctx
        pub = ctx.socket(zmq.PUB)
        pub.set_hwm(self.config.hwm)
        sockets: list[tuple[str, str, zmq.Socket[Any]]] = [("endpoint", self.endpoint, pub)]
        replay = None
        if self.replay_endpoint is not None:
            replay = ctx.socket(zmq.ROUTER)
            sockets.append(("replay_endpoint", self.replay_endpoint, replay))
        for key, address, sock in sockets:
            try:
                if self.config.curve_secret_key_file is not None:
                    self._secure(sock)
                if key == "endpoint" and not self.config.binds(address):
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
        try:
            pub, replay = self._bind()
        except BaseException as e:   # handed to the constructor, which raises it
            started.put(e)
            return
        started.put(None)
        try:
            while self._publish_queued(pub, wait=0.0 if self._replays else 0.05):
                if replay is not None:
                    self._admit_replays(replay)
                    self._send_replay_slice(replay)
        finally:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)

    def _publish_queued(self, pub: zmq.Socket[Any], wait: float) -> bool:
        """Publish every queued batch (waiting up to `wait` for the first); False at close."""
        try:
            batch = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
        except queue.Empty:
            return True
        while batch is not None:
            seq = self.num_published
            payload = self._encoder.encode(batch)
            pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))
            self.num_published += 1
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                return True
        return False

    def _admit_replays(self, replay: zmq.Socket[Any]) -> None:
        for _ in range(4 * REPLAY_SLICE):   # bounded intake per turn
            if not replay.poll(0):
                return
            frames = replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue   # not a replay request (client id, empty delimiter, 8-byte start)
            client = frames[0]
            peer = self._peers.pop(client, None) or TokenBucket(self.config.replay_peer_rate, self.config.replay_burst)
            self._peers[client] = peer
            if len(self._peers) > 1024:
                self._peers.popitem(last=False)
            if len(self._replays) < MAX_ACTIVE_REPLAYS and peer.take() and self._total.take():
                self._replays.append([client, int.from_bytes(frames[2], "big")])
                self.num_replays_served += 1
            else:
                self.num_replays_refused += 1
                replay.send_multipart((client, b"", b"", END_SEQ.to_bytes(8, "big", signed=True), b""))

    def _send_replay_slice(self, replay: zmq.Socket[Any]) -> None:
        budget = REPLAY_SLICE
        while self._replays and budget > 0:
            entry = self._replays[0]
            client, seq = entry
            first = self._buffer[0][0] if self._buffer else self.num_published
            seq = max(seq, first)
            while budget > 0 and seq < self.num_published:
                replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), self._buffer[seq - first][1]))
                seq, budget = seq + 1, budget - 1
            entry[1] = seq
            if seq >= self.num_published:
                replay.send_multipart((client, b"", b"", END_SEQ.to_bytes(8, "big", signed=True), b""))
                self._replays.popleft()


# ---------------------------------------------------------------------- subscriber

class KVEventSubscriber:
    """SUB socket for the live stream, DEALER for replay; `poll()` returns batches in
    sequence order, asking the replay socket for any it missed (a gap in the numbers)."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 curve_server_key: bytes | None = None, curve_client_key_file: str | None = None) -> None:
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._curve: tuple[bytes, bytes, bytes] | None = None
        if curve_server_key is not None:   # the server's public key, and this client's certificate
            if curve_client_key_file is None:
                raise ValueError("KVEventSubscriber: curve_server_key needs curve_client_key_file")
            self._curve = (curve_server_key, *_curve_keys(curve_client_key_file, "curve_client_key_file"))
        self._sub = self._socket(zmq.SUB)
        self._sub.connect(connect_address(endpoint))
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._replay: zmq.Socket[Any] | None = None
        if replay_endpoint is not None:
            self._replay = self._socket(zmq.DEALER)
            self._replay.connect(connect_address(replay_endpoint))
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.next_seq = 0
        self.num_replayed = 0

    def _socket(self, kind: int) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] = self._ctx.socket(kind)
        if self._curve is not None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self._curve
        return sock

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
