"""KV events on the wire: vLLM's KVEventsConfig fields (unknown keys and a port in use are
clear errors), msgpack KVEventBatch frames on a real ZMQ PUB socket with sequence numbers,
the ROUTER replay socket, and vLLM's own decoder reading our frames (when its venv exists)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import msgspec
import pytest

from pacer.deploy.kv_index import BlockIndex, from_wire
from pacer.kv.events import BlockRemovedEvent, BlockStoredEvent
from pacer.request import SamplingParams
from pacer.telemetry.kv_events import (
    KVEventBatch,
    KVEventPublisher,
    KVEventSubscriber,
    offset_endpoint,
    parse_kv_events_config,
    to_wire,
)
from tests.fakes import Arrival, drive_arrivals, make_engine

VLLM_PYTHON = Path(os.environ.get("PACER_VLLM_PYTHON", "/tmp/pacer-peers/vllm-venv/bin/python"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_port_pair() -> int:
    """A port that is free with the one after it (a second replica binds port + 1)."""
    while True:
        port = _free_port()
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port + 1))
            except OSError:
                continue
        return port


def test_config_takes_vllm_fields_and_rejects_unknown_keys_and_bad_types():
    c = parse_kv_events_config('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
                               '"replay_endpoint": "tcp://*:5558", "topic": "kv"}')
    assert (c.enabled, c.endpoint, c.replay_endpoint, c.topic, c.buffer_steps) == (
        True, "tcp://*:5557", "tcp://*:5558", "kv", 10_000)
    assert parse_kv_events_config('{"enable_kv_cache_events": true}').publisher == "zmq"   # vLLM's default
    assert not parse_kv_events_config("{}").enabled
    with pytest.raises(ValueError, match=r"unknown key 'endpiont'.*known keys: enable_kv_cache_events"):
        parse_kv_events_config('{"enable_kv_cache_events": true, "endpiont": "tcp://*:1"}')
    with pytest.raises(ValueError, match="buffer_steps must be int"):
        parse_kv_events_config('{"buffer_steps": "10"}')
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_kv_events_config("{enable_kv_cache_events: true}")
    with pytest.raises(ValueError, match="publisher must be 'zmq' or 'null'"):
        parse_kv_events_config('{"publisher": "kafka"}')
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("tcp://*:0", 2) == "tcp://*:0"


def test_port_in_use_is_a_clear_error():
    port = _free_port_pair()   # a CI run once found port + 1 taken by another socket
    cfg = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}"})
    first = KVEventPublisher(cfg)
    try:
        with pytest.raises(ValueError, match=rf"cannot bind endpoint tcp://\*:{port}: Address already in use"):
            KVEventPublisher(cfg)
        second = KVEventPublisher(cfg, replica_index=1)   # replica 1 takes port + 1
        assert second.endpoint == f"tcp://0.0.0.0:{port + 1}"
        second.close()
    finally:
        first.close()


def _engine_batches() -> list[tuple[float, list]]:
    """A real engine run's event batches (eviction included)."""
    eng, _ = make_engine(num_blocks=16, block_size=2, max_len=30, max_num_batched_tokens=10, max_num_seqs=2,
                         tenant_isolation="isolated")
    batches: list[tuple[float, list]] = []
    eng.add_kv_event_sink(lambda now, events: batches.append((now, list(events))))
    arrivals = [Arrival(i, f"q{i}", [3, 4, 5, 6] + [(i * 5 + j) % 40 + 10 for j in range(6)],
                        SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), None, {"tenant": "ab"[i % 2]})
                for i in range(8)]
    drive_arrivals(eng, arrivals, lambda: None, max_steps=400)
    assert any(isinstance(e, BlockRemovedEvent) for _, ev in batches for e in ev)
    return batches


def test_publisher_stream_and_replay_reproduce_the_cache():
    batches = _engine_batches()
    cfg = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": "tcp://*:0",
                                  "replay_endpoint": "tcp://*:0", "topic": "kv"})
    pub = KVEventPublisher(cfg)
    sub = KVEventSubscriber(pub.endpoint, pub.replay_endpoint, topic="kv")
    try:
        for ts, events in batches:
            pub.publish(ts, events)
        got: list = []
        beats = 0
        while not got and beats < 100:   # the first frames are lost until SUB is connected (slow joiner)
            pub.publish(0.0, [])
            beats += 1
            got.extend(sub.poll(100))
        total = len(batches) + 1 + beats   # + the AllBlocksCleared the publisher starts with
        while got[-1][0] < total - 1:
            got.extend(sub.poll(2000) or pytest.fail("frames stopped arriving"))
        # any gap before the first live frame is filled from the replay socket, in order
        assert [seq for seq, _ in got] == list(range(total))
        assert type(got[0][1].events[0]).__name__ == "AllBlocksCleared"
        live, replayed = BlockIndex(strict=True), BlockIndex(strict=True)
        for _, batch in got:
            live.apply("r", from_wire(batch))
        for _, batch in sub.replay(0):   # a consumer that joined late asks for everything
            replayed.apply("r", from_wire(batch))
        expect = BlockIndex(strict=True)
        for _, events in batches:
            expect.apply("r", events)
        assert live.blocks("r") == expect.blocks("r") == replayed.blocks("r")
        assert sub.replay(len(batches) - 1)[0][0] == len(batches) - 1   # replay from a given sequence
    finally:
        sub.close()
        pub.close()


def test_wire_fields_are_vllms():
    batch = to_wire([BlockStoredEvent((1, 2), None, (5, 6, 7, 8), 2, ("a",)), BlockRemovedEvent((2,))], 1.5, 3)
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(batch))
    assert raw[0] == 1.5 and raw[2] == 3   # array-like batch: ts, events, data_parallel_rank
    stored, removed = raw[1]
    assert stored == {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
                      "token_ids": [5, 6, 7, 8], "block_size": 2, "lora_id": None, "medium": "GPU",
                      "lora_name": None, "extra_keys": [["a"], ["a"]]}
    assert removed == {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"}
    assert isinstance(msgspec.msgpack.Decoder(KVEventBatch).decode(msgspec.msgpack.encode(batch)), KVEventBatch)


_VLLM_DECODE = """
import json, sys, msgspec
from vllm.distributed.kv_events import KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared
dec = msgspec.msgpack.Decoder(type=KVEventBatch)
held = set()
for line in sys.stdin:
    batch = dec.decode(bytes.fromhex(line.strip()))
    for e in batch.events:
        if isinstance(e, BlockStored):
            assert e.medium == "GPU" and len(e.token_ids) == e.block_size * len(e.block_hashes)
            held.update(e.block_hashes)
        elif isinstance(e, BlockRemoved):
            held.difference_update(e.block_hashes)
        elif isinstance(e, AllBlocksCleared):
            held.clear()
print(json.dumps(sorted(held)))
"""


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="vLLM's venv (../shared/peers/setup.sh vllm) is not built")
def test_vllms_own_decoder_reads_the_stream_and_reproduces_the_cache():
    batches = _engine_batches()
    enc = msgspec.msgpack.Encoder()
    lines = "".join(enc.encode(to_wire(events, ts, 0)).hex() + "\n" for ts, events in batches)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(VLLM_PYTHON), "-c", _VLLM_DECODE], input=lines, capture_output=True, text=True,
                         env=env, timeout=300, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    expect = BlockIndex(strict=True)
    for _, events in batches:
        expect.apply("r", events)
    assert expect.blocks("r") and set(json.loads(out.stdout.strip().splitlines()[-1])) == expect.blocks("r")


def test_publisher_connects_to_a_consumer_that_binds():
    """llm-d's EPP can bind one SUB socket that every model server connects to (vLLM's rule:
    an endpoint without a wildcard is connected to)."""
    import zmq

    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    pub = KVEventPublisher(parse_kv_events_config({"enable_kv_cache_events": True,
                                                   "endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv@pod-1@m"}))
    try:
        assert pub.endpoint == f"tcp://127.0.0.1:{port}"
        got = None
        for _ in range(50):   # the PUB side drops frames until the connection is up (ZMQ slow joiner)
            pub.publish(0.0, [BlockRemovedEvent((7,))])
            if sub.poll(100):
                got = sub.recv_multipart()
                break
        assert got is not None and got[0] == b"kv@pod-1@m"
        names = {type(e).__name__ for e in msgspec.msgpack.Decoder(KVEventBatch).decode(got[2]).events}
        assert names <= {"AllBlocksCleared", "BlockRemoved"} and names
    finally:
        pub.close()
        sub.close(linger=0)
