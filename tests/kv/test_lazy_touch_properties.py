"""Property test: a locked insert's touch kept pending on its deepest node (`_touch_locked`, written to
each node when its eviction key is first read: `settle`) evicts exactly as the touch written to the
whole path at once (`_touch`) does: the same blocks in the same order, under lru and weighted-lru,
with splits of locked nodes (another request matching part of a path), finishes and clock ticks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacer.clock import VirtualClock
from pacer.kv.prefix_cache import PrefixCache
from pacer.kv.radix_node import WALK_TICKS, PrefixMatch, RadixNode
from tests.kv.test_relock_properties import prompts_strategy  # six requests over a shared base

BS = 2
ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 3)),   # request i caches k more blocks
        st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 3)),
        st.tuples(st.just("finish"), st.integers(0, 5)),
        st.tuples(st.just("match"), st.integers(0, 5), st.integers(1, 12)),  # a look-up of a prefix (may split)
        st.tuples(st.just("evict"), st.integers(1, 6)),
        st.tuples(st.just("tick"), st.floats(0.0, 5.0)),
    ),
    min_size=4, max_size=60,
)


class _Side:
    def __init__(self, clock: VirtualClock, policy: str, lazy: bool) -> None:
        self.cache = PrefixCache(BS, clock.now, policy, tenant_weights={"heavy": 3.0})
        if not lazy:   # every touch written to its whole path at once
            def eager(node: RadixNode, tenant: str) -> None:
                self.cache._touch(node, tenant)
            self.cache._touch_locked = eager   # type: ignore[method-assign]
        self.handles: dict[int, PrefixMatch] = {}
        self.next_block = 0

    def grow(self, i: int, tokens: list[int], k: int) -> None:
        old = self.handles.get(i)
        n = min((old.num_blocks if old else 0) + k, len(tokens) // BS)
        if n == 0 or (old is not None and n <= old.num_blocks):
            return
        blocks = list(range(self.next_block, self.next_block + n))
        self.next_block += n
        tenant = "heavy" if i % 2 else "light"
        _, self.handles[i] = self.cache.insert(tokens[:n * BS], blocks, "", tenant, start=old, lock=True)

    def finish(self, i: int) -> None:
        handle = self.handles.pop(i, None)
        if handle is not None:
            self.cache.unlock(handle)

    def state(self) -> Any:
        """The tree, and each eviction candidate's key as read (its touch's time, floor and walk;
        a tick's place within its walk may differ, and orders nothing: no two candidates share a walk)."""
        nodes = sorted(self.cache.iter_nodes(), key=lambda n: n.id)
        return ([(n.id, n.lock_ref, n.is_leaf_candidate, tuple(n.block_ids)) for n in nodes],
                [(n.id, n.last_access, n.priority, n.tick // WALK_TICKS) for n in nodes if n.is_leaf_candidate],
                self.cache.num_evictable_blocks, self.cache.num_cached_blocks)


@pytest.mark.parametrize("policy", ["lru", "weighted-lru"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, prompts=prompts_strategy)
def test_pending_touch_evicts_as_a_written_one(policy: str, ops: list[tuple[Any, ...]],
                                               prompts: list[list[int]]) -> None:
    clock = VirtualClock()
    lazy, eager = _Side(clock, policy, lazy=True), _Side(clock, policy, lazy=False)
    for op in ops:
        if op[0] == "evict":
            assert lazy.cache.evict(op[1]) == eager.cache.evict(op[1])
        elif op[0] == "tick":
            clock.advance(op[1])
        for side in (lazy, eager):
            if op[0] == "grow":
                side.grow(op[1], prompts[op[1]], op[2])
            elif op[0] == "finish":
                side.finish(op[1])
            elif op[0] == "match":
                tokens = prompts[op[1]]
                side.cache.match_prefix(tokens, ("",), op[2], "light")
        assert lazy.state() == eager.state()
    for side in (lazy, eager):
        for i in list(side.handles):
            side.finish(i)
    assert lazy.cache.evict(10_000) == eager.cache.evict(10_000)
    assert lazy.cache.num_cached_blocks == 0
