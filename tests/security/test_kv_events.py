"""KV events are safe by default: enabled without an endpoint they bind loopback only (a real
subscriber on another loopback address gets nothing and a TCP connect there is refused), a
wildcard bind warns, salts never leave the process, replay is rate-limited and served after
the live stream, and CURVE keeps a client without the server's key out."""

from __future__ import annotations

import logging
import socket

import msgspec
import pytest
import zmq

from pacer.config.kv_events import DEFAULT_ENDPOINT, parse_kv_events_config
from pacer.kv.events import BlockRemovedEvent, BlockStoredEvent, namespace, namespace_keys
from pacer.telemetry.kv_events import END_SEQ, KVEventPublisher, KVEventSubscriber, to_wire


def _first_batch(sub: KVEventSubscriber, pub: KVEventPublisher, tries: int = 50) -> bool:
    """Publish until the subscriber sees a batch (ZMQ's slow joiner drops frames until connected)."""
    for _ in range(tries):
        pub.publish(0.0, [BlockRemovedEvent((7,))])
        if sub.poll(100):
            return True
    return False


def test_default_binds_loopback_only():
    cfg = parse_kv_events_config({"enable_kv_cache_events": True})
    assert cfg.address == DEFAULT_ENDPOINT == "tcp://127.0.0.1:5557" and cfg.binds(cfg.address)
    # vLLM's rule still holds for a given endpoint: a host address connects, a wildcard binds,
    # and `bind: true` asks for a bind on a host address.
    explicit = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:0"})
    assert not explicit.binds(explicit.address)
    assert parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": "tcp://*:0"}).binds("tcp://*:0")
    cfg = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:0", "bind": True})
    pub = KVEventPublisher(cfg)
    port = int(pub.endpoint.rpartition(":")[2])
    local = KVEventSubscriber(f"tcp://127.0.0.1:{port}")
    other = KVEventSubscriber(f"tcp://127.0.0.2:{port}")   # another loopback address: another interface
    try:
        assert pub.endpoint.startswith("tcp://127.0.0.1:")
        assert _first_batch(local, pub)
        pub.publish(0.0, [BlockRemovedEvent((8,))])
        assert local.poll(2000)
        assert other.poll(200) == []   # never connected: nothing arrives
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", port), timeout=5):
            pass
    finally:
        for s in (local, other):
            s.close()
        pub.close()


def test_wildcard_bind_warns_what_the_stream_carries(caplog):
    cfg = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": "tcp://*:0"})
    with caplog.at_level(logging.WARNING, logger="pacer.kv_events"):
        pub = KVEventPublisher(cfg)
        pub.close()
    assert any("every interface" in r.message and "token ids of every tenant's prompts" in r.message
               for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pacer.kv_events"):
        KVEventPublisher(parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:0",
                                                 "bind": True})).close()
    assert not caplog.records


def test_salts_never_leave_the_process():
    owner = namespace("acme", "s3cret-salt")
    keys = namespace_keys(owner)
    assert keys == ("acme", "salted")
    wire = msgspec.msgpack.encode(to_wire([BlockStoredEvent((1,), None, (5, 6), 2, keys)], 0.0))
    assert b"s3cret-salt" not in wire and b"acme" in wire
    assert namespace_keys(namespace("", "s3cret-salt")) == ("salted",)


def test_replay_flood_is_rate_limited_and_live_goes_first():
    cfg = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:0", "bind": True,
                                  "replay_endpoint": "tcp://127.0.0.1:0", "replay_burst": 3,
                                  "replay_rate": 1e-6, "replay_peer_rate": 1e-6})
    pub = KVEventPublisher(cfg)
    live = KVEventSubscriber(pub.endpoint)
    flood = zmq.Context.instance().socket(zmq.DEALER)
    flood.connect(pub.replay_endpoint or "")
    try:
        assert _first_batch(live, pub)
        for _ in range(40):
            flood.send_multipart((b"", (0).to_bytes(8, "big")))
        ends = 0
        while ends < 40 and flood.poll(5000):   # every request is answered: replayed, or refused at once
            frames = flood.recv_multipart()
            ends += int.from_bytes(frames[2], "big", signed=True) == END_SEQ
        assert ends == 40
        assert (pub.num_replays_served, pub.num_replays_refused) == (3, 37)
        before = pub.num_published
        for i in range(5):
            pub.publish(float(i), [BlockRemovedEvent((100 + i,))])
        while live.next_seq < before + 5 and live.poll(2000):
            pass
        assert live.next_seq >= before + 5   # the live stream carried on during the flood
    finally:
        flood.close(linger=0)
        live.close()
        pub.close()


def test_replay_is_sliced_after_the_live_batches():
    """The mechanism: one loop turn publishes every queued live batch, then at most
    REPLAY_SLICE replay frames (a long replay is spread over turns)."""
    import pacer.telemetry.kv_events as ke

    src = ke.KVEventPublisher._run.__code__.co_names
    assert src.index("_publish_queued") < src.index("_admit_replays") < src.index("_send_replay_slice")
    assert ke.REPLAY_SLICE <= 64


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq built without CURVE")
def test_curve_keeps_clients_without_the_key_out(tmp_path):
    import zmq.auth

    server_pub, server_secret = zmq.auth.create_certificates(tmp_path, "server")
    clients = tmp_path / "clients"
    clients.mkdir()
    client_pub, client_secret = zmq.auth.create_certificates(clients, "client")
    _, stranger_secret = zmq.auth.create_certificates(tmp_path, "stranger")
    cfg = parse_kv_events_config({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:0", "bind": True,
                                  "curve_secret_key_file": server_secret, "curve_client_keys_dir": str(clients)})
    pub = KVEventPublisher(cfg)
    server_key = zmq.auth.load_certificate(server_pub)[0]
    good = KVEventSubscriber(pub.endpoint, curve_server_key=server_key, curve_client_key_file=client_secret)
    stranger = KVEventSubscriber(pub.endpoint, curve_server_key=server_key, curve_client_key_file=stranger_secret)
    plain = KVEventSubscriber(pub.endpoint)
    try:
        assert _first_batch(good, pub)
        pub.publish(0.0, [BlockRemovedEvent((9,))])
        assert good.poll(2000)
        assert stranger.poll(200) == [] and plain.poll(200) == []
    finally:
        for s in (good, stranger, plain):
            s.close()
        pub.close()
