"""Routers in pure Python: round-robin, least-loaded, prefix (from KV events, bounded
imbalance, tenant-scoped), class pools; and the same routers over N simulated engines."""

from __future__ import annotations

import pytest

from pacer.config import EngineConfig
from pacer.deploy.kv_index import BlockIndex
from pacer.deploy.routers import (
    Cluster,
    PrefixRouter,
    RouteRequest,
    make_router,
    parse_pools,
    request_namespace,
)
from pacer.kv.events import BlockRemovedEvent, BlockStoredEvent, chain_hashes
from pacer.perf.profiles import get_hardware, get_model
from pacer.sim.cluster import build_cluster, simulate_cluster
from pacer.sim.simulator import SimRequest

BS = 4


def _store(index: BlockIndex, replica: str, tokens: list[int], owner: str = "") -> None:
    hashes = chain_hashes(None, tokens, BS, owner)
    index.apply(replica, [BlockStoredEvent(tuple(hashes), None, tuple(tokens), BS, None)])


def _cluster(n: int = 3) -> Cluster:
    return Cluster([f"r{i}" for i in range(n)], {f"r{i}": 0 for i in range(n)}, BlockIndex(), BS)


def test_round_robin_and_least_loaded():
    c = _cluster()
    rr = make_router("round-robin", 3)
    assert [rr.choose(RouteRequest(str(i), [1]), c) for i in range(4)] == ["r0", "r1", "r2", "r0"]
    c.load.update({"r0": 3, "r1": 1, "r2": 2})
    assert make_router("least-loaded", 3).choose(RouteRequest("x", [1]), c) == "r1"


def test_prefix_router_follows_the_cache_and_bounds_imbalance():
    c = _cluster()
    system = list(range(100, 132))   # 8 blocks
    _store(c.index, "r2", system)
    router = PrefixRouter(balance_abs_threshold=2, balance_rel_threshold=1.5)
    req = RouteRequest("a", system + [1, 2, 3, 4, 5])
    assert router.choose(req, c) == "r2"
    c.load.update({"r2": 3, "r0": 1, "r1": 1})    # 2 above the least loaded: still within the bound
    assert router.choose(req, c) == "r2"
    c.load["r2"] = 4                               # 3 above and 4x: overloaded, go least-loaded
    assert router.choose(req, c) in ("r0", "r1") and router.num_balanced == 1
    fresh = PrefixRouter()
    other = RouteRequest("b", list(range(500, 540)))
    first = fresh.choose(other, _cluster())
    assert fresh.choose(other, _cluster()) == first   # pending decision remembered before events arrive


def _homes(router: PrefixRouter, order: list[int], n_replicas: int = 2, n: int = 640,
           cached: tuple[int, ...] = (0, 1)) -> tuple[float, dict[int, set[str]]]:
    """Route a skewed stream (prompt `order[i % len(order)]`, the `cached` prompts starting on r0)
    over replicas whose loads stay even (a closed loop) and whose caches keep every prompt they
    served (reported as KV events): the busiest replica's share of the last 256 decisions and
    where each prompt went in them."""
    c = _cluster(n_replicas)
    prompts = [[k * 1000 + i for i in range(16)] for k in range(max(order) + 1)]
    for k in cached:
        _store(c.index, "r0", prompts[k])
    stored = {"r0": set(cached)}
    last: list[tuple[int, str]] = []
    for i in range(n):
        k = order[i % len(order)]
        choice = router.choose(RouteRequest(str(i), prompts[k] + [i % 7 + 1]), c)
        if k not in stored.setdefault(choice, set()):
            stored[choice].add(k)
            _store(c.index, choice, prompts[k])
        last.append((k, choice))
    tail = last[-256:]
    share = max(sum(1 for _, r in tail if r == rid) for rid in c.replica_ids) / len(tail)
    homes: dict[int, set[str]] = {}
    for k, r in tail:
        homes.setdefault(k, set()).add(r)
    return share, homes


SKEWED = [0, 1, 0, 2, 0, 3, 0, 1, 0, 2, 0, 1]   # 0: 6/12, 1: 3/12, 2: 2/12, 3: 1/12


def test_prefix_router_bounds_each_replicas_recent_share_by_moving_its_lesser_prefixes():
    unbounded_share, _ = _homes(PrefixRouter(max_share_slack=None), SKEWED)
    assert unbounded_share > 0.7            # load never differs: the load bound alone never balances
    share, homes = _homes(PrefixRouter(max_share_slack=0.2), SKEWED)
    assert share <= 0.6
    # every prompt settles on one replica: moves happen once, not back and forth
    assert {k: len(h) for k, h in homes.items()} == {0: 1, 1: 1, 2: 1, 3: 1}
    with pytest.raises(ValueError, match="max_share_slack"):
        PrefixRouter(max_share_slack=-0.1)


def test_prefix_router_gives_a_prefix_too_hot_for_one_replica_more_homes():
    order = [0] * 7 + [1, 2, 3]               # prompt 0 is 70% of the traffic over 4 replicas
    router = PrefixRouter(max_share_slack=0.2)
    share, homes = _homes(router, order, n_replicas=4, cached=(0,))
    assert share <= 0.31                    # 1.2 x the even 25%, within a couple of requests
    assert len(homes[0]) == 3               # 70% over homes of at most 30% each
    assert all(len(homes[k]) == 1 for k in (1, 2, 3))
    assert router.num_rehomed <= 6          # each move or new home once


def test_prefix_router_drops_a_home_that_lost_the_prefix():
    c = _cluster(3)
    prompt = list(range(100, 132))
    router = PrefixRouter(max_share_slack=None)
    homes = {router.choose(RouteRequest(str(i), prompt + [i]), c) for i in range(2)}
    assert len(homes) == 1                   # the second follows the first's pending blocks
    (home,) = homes
    _store(c.index, home, prompt)            # its events arrive: the pending copy goes
    other = next(r for r in c.replica_ids if r != home)
    _store(c.index, other, prompt)           # a detour left a copy on another replica
    head = hash(tuple(prompt[:BS])) ^ hash("")
    assert router.choose(RouteRequest("x", prompt + [9]), c) == home   # equal matches: home wins
    c.index.apply(home, [BlockRemovedEvent(tuple(chain_hashes(None, prompt, BS, "")))])
    assert router.choose(RouteRequest("y", prompt + [9]), c) == other  # evicted at home: seen at once
    assert router.homes.homes(head) == (other,)


def test_prefix_router_matches_only_within_the_tenant_in_isolated_mode():
    c = _cluster(2)
    tokens = list(range(10, 42))
    _store(c.index, "r1", tokens, owner=request_namespace("alice", None, "isolated"))
    router = PrefixRouter()
    bob = RouteRequest("b", tokens + [1], "bob", request_namespace("bob", None, "isolated"))
    alice = RouteRequest("a", tokens + [1], "alice", request_namespace("alice", None, "isolated"))
    assert router.choose(alice, c) == "r1"
    assert router.num_prefix_routed == 1
    router.choose(bob, c)
    assert router.num_prefix_routed == 1   # bob's match found nothing of alice's: routed by load


def test_class_pools():
    c = _cluster(4)
    router = make_router("class", 4, pools="long_context=1")
    assert router.choose(RouteRequest("l", [1], request_class="long_context"), c) == "r3"
    chats = {router.choose(RouteRequest(str(i), [1], request_class="chat"), c) for i in range(6)}
    assert chats <= {"r0", "r1", "r2"}
    assert parse_pools(None, 8) == {"long_context": [6, 7]}
    with pytest.raises(ValueError, match="leave at least one"):
        parse_pools("long_context=2", 2)
    with pytest.raises(ValueError, match="--router must be one of"):
        make_router("random", 2)


def _trace(n: int, seed: int = 0) -> list[SimRequest]:
    prompts = [[(p * 131 + j) % 900 + 10 for j in range(256)] for p in range(4)]
    out = []
    for i in range(n):
        p = [0, 0, 0, 1, 1, 2, 3][(i * 5 + seed) % 7]   # some system prompts more popular
        out.append(SimRequest(f"q{i}", i * 0.05, prompts[p] + [(i * 17 + j) % 500 + 1000 for j in range(20)], 16))
    return out


def _run(router_name: str, n_replicas: int = 4):
    config = EngineConfig.from_kwargs(num_kv_blocks=44, block_size=16, max_model_len=512)   # ~2 of 4 prompts
    index = BlockIndex(strict=True)
    replicas = build_cluster(n_replicas, config, get_hardware("h200-sxm"), get_model("llama-3.1-8b"), index)
    result = simulate_cluster(replicas, make_router(router_name, n_replicas), index, _trace(120), block_size=16)
    for r in replicas:   # the router's mirror equals every engine's cache at the end
        assert index.blocks(r.replica_id) == {h for node in r.engine.kv.cache.iter_nodes() for h in node.hashes}
    return result


def test_simulated_cluster_prefix_beats_round_robin_on_hits():
    rr, prefix = _run("round-robin"), _run("prefix")
    assert len(rr.records) == len(prefix.records) == 120
    assert all(r.ok for r in prefix.records)
    assert prefix.hit_rate() >= 1.3 * rr.hit_rate() > 0
    assert max(prefix.load_split()) <= 0.6


def _in_flight(records) -> int:
    """The most requests in flight at once (sent, not yet finished)."""
    events = sorted([(r.arrival_time, 1) for r in records] + [(r.finish_time, -1) for r in records],
                    key=lambda e: (e[0], e[1]))   # a finish frees its slot before a send at the same instant
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


@pytest.mark.parametrize("paced", [False, True])
def test_simulated_cluster_caps_requests_in_flight(paced):
    """--concurrency over the deployment: a closed loop of 3 clients (no arrival times), or a
    rate capped at 3 in flight; never a fourth request before one finishes, none sent early."""
    config = EngineConfig.from_kwargs(num_kv_blocks=200, block_size=16, max_model_len=512)
    index = BlockIndex()
    replicas = build_cluster(2, config, get_hardware("h200-sxm"), get_model("llama-3.1-8b"), index)
    trace = [SimRequest(r.request_id, r.arrival_time / 10 if paced else None, r.prompt_token_ids, r.output_tokens)
             for r in _trace(24)]
    result = simulate_cluster(replicas, make_router("least-loaded", 2), index, trace, block_size=16, concurrency=3)
    assert len(result.records) == 24 and all(r.ok for r in result.records)
    assert _in_flight(result.records) == 3
    if paced:
        assert all(rec.arrival_time >= req.arrival_time - 1e-9 for rec, req in zip(result.records, trace))
    with pytest.raises(ValueError, match="--concurrency"):
        simulate_cluster(replicas, make_router("least-loaded", 2), index, trace, block_size=16, concurrency=0)


def test_a_long_session_history_is_its_own_routing_key():
    """Agents sharing one system prompt: each session's long history goes home to the replica
    holding it, not to the system prompt's home."""
    from pacer.deploy.routers import SESSION_ROUTING_MIN_TOKENS

    c = _cluster(2)
    system = list(range(100, 132))
    _store(c.index, "r0", system)
    history = system + list(range(1000, 1000 + SESSION_ROUTING_MIN_TOKENS))
    _store(c.index, "r1", history)          # agent-1's retained history lives on r1
    router = PrefixRouter()
    assert router.choose(RouteRequest("a", system + [1, 2, 3, 4]), c) == "r0"
    turn = RouteRequest("b", history + [7, 7, 7, 7], session="agent-1")
    assert router.choose(turn, c) == "r1"
    assert router.homes.homes(hash(("session", "", "agent-1"))) == ("r1",)


def test_simulated_cluster_routes_sessions_and_retains_their_histories():
    """`pacer sim --replicas` passes a turn's session to the router and the engine, as the server
    and the Ray ingress do: each session's long history is its own routing key (the router keeps
    a home per session), its later turns go to the replica holding that history, and each
    finished turn opens a retention window there."""
    from pacer.deploy.routers import SESSION_ROUTING_MIN_TOKENS

    system = [(j * 7) % 900 + 10 for j in range(256)]
    histories = {f"agent-{a}": [(a * 131 + j * 3) % 500 + 1000 for j in range(SESSION_ROUTING_MIN_TOKENS)]
                 for a in range(4)}
    trace = []
    for turn in range(3):
        for a, (name, history) in enumerate(histories.items()):
            prompt = system + history[: SESSION_ROUTING_MIN_TOKENS // 2 * (turn + 1)] + [2000 + turn] * 8
            trace.append(SimRequest(f"{name}-t{turn}", turn * 2.0 + a * 0.1, prompt, 8, session=name))
    config = EngineConfig.from_kwargs(num_kv_blocks=600, block_size=16, max_model_len=2048)
    index = BlockIndex(strict=True)
    replicas = build_cluster(2, config, get_hardware("h200-sxm"), get_model("llama-3.1-8b"), index)
    router = make_router("prefix", 2)
    result = simulate_cluster(replicas, router, index, trace, block_size=16)
    assert all(r.ok for r in result.records)
    owner = request_namespace("default", None, "shared")
    for name in histories:
        later = {result.replica_of[f"{name}-t{t}"] for t in (1, 2)}
        assert len(later) == 1                                          # later turns stay home
        assert router.homes.homes(hash(("session", owner, name))) == tuple(later)
    opened = sum(r.engine.kv.retention.stats.windows_opened for r in replicas)
    assert opened == len(trace)                                         # every finished turn kept its history
