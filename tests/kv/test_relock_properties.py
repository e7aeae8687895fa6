"""Property test: `PrefixCache.relock(old, new)` (a running request's lock moving down its path as
its blocks are cached, walking only the new nodes) leaves the cache exactly as `lock(new)` then
`unlock(old)` does: the same locks, evictable counts, eviction candidates and eviction order.
And every handle `insert` returns names the blocks of its node's path (insert builds that list
as it walks instead of walking back up)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pacer.clock import VirtualClock
from pacer.kv.prefix_cache import PrefixCache
from pacer.kv.radix_node import PrefixMatch

BS = 2
ops_strategy = st.lists(
    st.one_of(
        # request i caches k more blocks of its tokens (its lock moves down)
        st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 3)),
        st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 3)),
        st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 3)),
        st.tuples(st.just("finish"), st.integers(0, 5)),
        st.tuples(st.just("evict"), st.integers(1, 6)),
        st.tuples(st.just("tick"), st.floats(0.0, 5.0)),
    ),
    min_size=4, max_size=60,
)
# six requests' tokens: a shared base cut at different lengths, then their own bits (shared
# nodes, splits, and paths of several new nodes below a request's lock)
prompts_strategy = st.tuples(
    st.lists(st.integers(0, 1), min_size=8, max_size=24),
    st.lists(st.tuples(st.integers(0, 24), st.lists(st.integers(0, 1), min_size=0, max_size=12)), min_size=6,
             max_size=6),
).map(lambda t: [t[0][:cut] + own for cut, own in t[1]])


class _Side:
    """One cache and its requests' handles; `moving` picks how a lock moves down."""

    def __init__(self, clock: VirtualClock, moving: bool) -> None:
        self.cache = PrefixCache(BS, clock.now, "lru")
        self.moving = moving
        self.handles: dict[int, PrefixMatch] = {}
        self.next_block = 0

    def grow(self, i: int, tokens: list[int], k: int) -> None:
        old = self.handles.get(i)
        n = min((old.num_blocks if old else 0) + k, len(tokens) // BS)
        if n == 0 or (old is not None and n <= old.num_blocks):
            return
        blocks = list(range(self.next_block, self.next_block + n))   # the request's own table
        self.next_block += n
        _, new = self.cache.insert(tokens[:n * BS], blocks, "", start=old)
        if old is None:
            self.cache.lock(new)
        elif self.moving:
            self.cache.relock(old, new)
        else:
            self.cache.lock(new)
            self.cache.unlock(old)
        self.handles[i] = new

    def finish(self, i: int) -> None:
        handle = self.handles.pop(i, None)
        if handle is not None:
            self.cache.unlock(handle)

    def state(self) -> Any:
        nodes = sorted(self.cache.iter_nodes(), key=lambda n: n.id)
        return ([(n.id, n.lock_ref, n.is_leaf_candidate, n.last_access, n.tick, tuple(n.block_ids)) for n in nodes],
                self.cache.num_evictable_blocks, self.cache.num_cached_blocks, self.cache.evictable_blocks())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops_strategy, prompts=prompts_strategy)
def test_relock_equals_lock_then_unlock(ops: list[tuple[Any, ...]], prompts: list[list[int]]) -> None:
    clock = VirtualClock()
    moving, pair = _Side(clock, moving=True), _Side(clock, moving=False)
    for op in ops:
        for side in (moving, pair):
            if op[0] == "grow":
                side.grow(op[1], prompts[op[1]], op[2])
            elif op[0] == "finish":
                side.finish(op[1])
        if op[0] == "evict":
            assert moving.cache.evict(op[1]) == pair.cache.evict(op[1])
        elif op[0] == "tick":
            clock.advance(op[1])
        assert moving.state() == pair.state()
        for side in (moving, pair):
            for handle in side.handles.values():
                assert list(handle.block_ids) == side.cache._path_blocks(handle.node)
    for side in (moving, pair):   # every lock is released exactly once
        for i in list(side.handles):
            side.finish(i)
    assert moving.state() == pair.state()
    assert moving.cache.evict(10_000) == pair.cache.evict(10_000)
    assert moving.cache.num_cached_blocks == 0
