"""Session retention (pacer.kv.retention) through the KV manager: the eviction order it adds
(retained after unretained, before pinned), its windows' deadlines, tenants and release, and
property tests under random agent turns, allocations, evictions and clock ticks."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacer.clock import VirtualClock
from pacer.errors import FieldValueError
from pacer.kv.manager import KVCacheManager
from pacer.kv.prefix_cache import PrefixCache
from pacer.kv.retention import SessionRetention, parse_retention_hint
from pacer.kv.tiers.host import HostKVTier
from pacer.request import FinishReason, Request, SamplingParams

BS = 2


def _kv(clock: VirtualClock, num_blocks: int = 24, policy: str = "lru", isolation: str = "shared",
        host_blocks: int = 0, max_blocks: int | None = None, ttl: float = 10.0) -> KVCacheManager:
    cache = PrefixCache(BS, clock.now, policy, ttl=30.0 if policy == "ttl" else None)
    host = HostKVTier(host_blocks, BS, clock.now, eviction_policy=policy) if host_blocks else None
    retention = SessionRetention(cache, clock.now, default_ttl=ttl, max_ttl=60.0, max_blocks=max_blocks)
    return KVCacheManager(num_blocks, BS, cache, tenant_isolation=isolation, host_tier=host, retention=retention)


def _turn(kv: KVCacheManager, clock: VirtualClock, rid: str, tokens: list[int], tenant: str = "t",
          session: str | None = None, finish: bool = True, **hint: object) -> Request | None:
    """Admit a request with all its tokens computed; finish it (a completed turn) unless told not to."""
    req = Request(rid, tokens, SamplingParams(max_tokens=1), arrival_time=clock.now(), tenant=tenant,
                  session=session, retention_ttl=hint.get("ttl"), retention_release=bool(hint.get("release")))
    hit = kv.lookup_prefix(req)
    assert hit is not None
    if kv.allocate_slots(req, len(tokens) - hit.num_tokens, hit) is None:
        return None
    req.num_computed_tokens = req.num_tokens
    if finish:
        req.finish_reason = FinishReason.STOP
        kv.free(req)
    return req


def _cached(kv: KVCacheManager) -> set[int]:
    return {b for node in kv.cache.iter_nodes() for b in node.block_ids}


def test_retained_conversation_is_evicted_after_unretained_and_found_by_its_next_turn() -> None:
    clock = VirtualClock()
    kv = _kv(clock)
    _turn(kv, clock, "agent-1", list(range(1, 9)), session="s1")     # 4 blocks, retained
    clock.advance(1)
    _turn(kv, clock, "chat-1", list(range(100, 108)))                 # 4 blocks, newer but unretained
    kv._release(kv.cache.evict(4), "capacity")
    assert kv.retention.stats.retained_blocks == 4
    nxt = _turn(kv, clock, "agent-2", list(range(1, 9)) + [50, 51], session="s1", finish=False)
    assert nxt is not None and nxt.metrics.retention_hit_tokens == 8 - BS + BS   # all 4 blocks: 8 tokens
    assert kv.retention.stats.returns == 1 and kv.retention.windows == {}
    kv.check_invariants()
    kv.retention.check_invariants()


def test_window_closes_at_its_deadline_and_gaps_are_learned() -> None:
    clock = VirtualClock()
    kv = _kv(clock, ttl=10.0)
    _turn(kv, clock, "a1", [1, 2, 3, 4, 5], session="s")
    assert kv.retention.windows
    clock.advance(10.0)
    kv.drop_expired()
    assert not kv.retention.windows and kv.retention.stats.expiries == 1
    # returns after 10 s, then 2 s: an EWMA (alpha 0.3); the next window lasts margin (4) x it
    _turn(kv, clock, "a2", [1, 2, 3, 4, 5, 6, 7], session="s")
    assert kv.retention.expected_gap("t", "s") == pytest.approx(10.0)
    clock.advance(2.0)
    _turn(kv, clock, "a3", [1, 2, 3, 4, 5, 6, 7, 8, 9], session="s")
    assert kv.retention.expected_gap("t", "s") == pytest.approx(0.3 * 2.0 + 0.7 * 10.0)
    window = kv.retention.windows[("t", "s")]
    assert window.deadline - window.opened == pytest.approx(4 * 7.6)


def test_release_hint_frees_the_conversation_at_once_and_tenants_do_not_cross() -> None:
    clock = VirtualClock()
    kv = _kv(clock, isolation="isolated")
    _turn(kv, clock, "a1", [1, 2, 3, 4, 5], tenant="a", session="s")
    _turn(kv, clock, "b1", [1, 2, 3, 4, 5], tenant="b", session="s")   # the same session name, another tenant
    assert set(kv.retention.windows) == {("a", "s"), ("b", "s")}
    free_before = kv.pool.num_free_blocks
    _turn(kv, clock, "a2", [1, 2, 3, 4, 5, 6, 7], tenant="a", session="s", release=True)
    assert set(kv.retention.windows) == {("b", "s")}
    assert kv.pool.num_free_blocks == free_before + 2   # a's conversation (its 2 blocks, a2's 3rd) freed at once
    assert kv.stats.evicted_blocks["release"] == 3
    assert all(node.owner == "b" for node in kv.cache.iter_nodes())
    kv.check_invariants()
    kv.retention.check_invariants()


def test_operator_cap_keeps_the_windows_expected_back_first() -> None:
    clock = VirtualClock()
    kv = _kv(clock, max_blocks=4)
    _turn(kv, clock, "a", [1, 2, 3, 4, 5], session="s1")
    clock.advance(1)
    _turn(kv, clock, "b", [9, 8, 7, 6, 5], session="s2")
    clock.advance(1)
    _turn(kv, clock, "c", [11, 12, 13, 14, 15], session="s3")   # expected back last: refused
    assert set(kv.retention.windows) == {("t", "s1"), ("t", "s2")}
    assert kv.retention.stats.capped == 1 and kv.retention.stats.retained_blocks <= 4
    _turn(kv, clock, "d", [21, 22, 23, 24, 25], session="s4", ttl=0.5)   # a short hint: s2 makes room
    assert set(kv.retention.windows) == {("t", "s1"), ("t", "s4")}
    assert kv.retention.stats.capped == 2


def test_hint_is_checked_with_the_field_and_the_limit() -> None:
    assert parse_retention_hint({"ttl_s": 5}, 60.0) == (5.0, False)
    assert parse_retention_hint({"release": True}, 60.0) == (None, True)
    with pytest.raises(ValueError, match=r"kv_retention.ttl_s must be a number in \[0, 60\]"):
        parse_retention_hint({"ttl_s": 61}, 60.0)
    with pytest.raises(ValueError, match="unknown keys"):
        parse_retention_hint({"keep": 1}, 60.0)
    from pacer.engine.prepare import check_session
    with pytest.raises(FieldValueError, match="needs a session"):
        check_session(None, {"ttl_s": 1}, 60.0)
    with pytest.raises(FieldValueError, match="at most 256"):
        check_session("x" * 300, None, 60.0)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.integers(0, 3), st.sampled_from("ab"), st.integers(1, 6)),
        st.tuples(st.just("chat"), st.lists(st.integers(0, 5), min_size=2, max_size=10), st.sampled_from("ab")),
        st.tuples(st.just("release"), st.integers(0, 3), st.sampled_from("ab")),
        st.tuples(st.just("tick"), st.floats(0, 15)),
        st.tuples(st.just("evict"), st.integers(1, 10)),
    ),
    max_size=50,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, policy=st.sampled_from(["lru", "weighted-lru", "ttl"]), isolation=st.sampled_from(["shared", "isolated"]),
       host_blocks=st.sampled_from([0, 6]), cap=st.sampled_from([None, 6]))
def test_retention_properties_under_random_agent_turns(ops, policy, isolation, host_blocks, cap) -> None:
    clock = VirtualClock()
    kv = _kv(clock, num_blocks=16, policy=policy, isolation=isolation, host_blocks=host_blocks, max_blocks=cap)
    histories: dict[tuple[str, int], list[int]] = {}
    n = 0
    for op in ops:
        n += 1
        if op[0] == "turn":
            key = (op[2], op[1])
            hist = histories.setdefault(key, [100 + 10 * op[1]])
            hist.extend(range(op[3]))     # the tool's answer and the next call: a growing history
            req = _turn(kv, clock, f"r{n}", list(hist), tenant=op[2], session=f"s{op[1]}")
            if req is not None:   # hits come only from the session's own window, whole blocks of its history
                assert req.metrics.retention_hit_tokens <= len(hist) - 1
                assert req.metrics.retention_hit_tokens % BS == 0
        elif op[0] == "chat":
            _turn(kv, clock, f"r{n}", [t + 1 for t in op[1]], tenant=op[2])
        elif op[0] == "release":
            before = kv.pool.num_free_blocks
            freed = kv.release_session(op[2], f"s{op[1]}")
            assert (op[2], f"s{op[1]}") not in kv.retention.windows
            assert kv.pool.num_free_blocks == before + freed     # freed at once
        elif op[0] == "tick":
            clock.advance(op[1])
            kv.drop_expired()
            now = clock.now()
            assert all(w.deadline > now for w in kv.retention.windows.values()), "a window outlived its TTL"
            kv.take_swap_ops()
        else:
            kv._release(kv.cache.evict(op[1]), "capacity")
        # never beyond capacity, counts exact; retention never holds what a request needs
        assert kv.pool.num_free_blocks >= 0 and kv.num_cached_blocks <= kv.num_blocks
        assert kv.num_available_blocks() == kv.pool.num_free_blocks + kv.num_evictable_blocks
        for w in kv.retention.windows.values():   # never crosses tenants: a window's own nodes are its tenant's
            if isolation == "isolated" and w.node.parent is not None and w.node.block_ids:
                assert w.node.owner in (w.tenant, "")
        if cap is not None:
            assert kv.retention.stats.retained_blocks <= cap
        kv.check_invariants()
        kv.retention.check_invariants()
    kv.retention.expire()
    clock.advance(1000)
    kv.drop_expired()
    assert not kv.retention.windows
    kv._release(kv.cache.evict(10_000), "capacity")
    assert kv.pool.num_free_blocks == kv.num_blocks, "a block leaked"
