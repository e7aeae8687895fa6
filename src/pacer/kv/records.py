"""The KV manager's plain records: a looked-up prefix hit (`PrefixHit`) and the engine-level
counters (`KVStats`). Pure Python; `kv_manager.py` re-exports both."""

from __future__ import annotations

from dataclasses import dataclass, field

from pacer.kv.prefix_cache import PrefixMatch

__all__ = ["PrefixHit", "KVStats"]


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """A looked-up cached prefix of a waiting request: no references taken until
    `allocate_slots` commits it (with the allocation), so a request that cannot be admitted
    after all has nothing to give back."""

    match: PrefixMatch
    num_tokens: int            # tokens it serves (whole blocks, short of the request's last token)
    num_queried_tokens: int    # the request's tokens looked up (counted when committed)
    promoted: tuple[tuple[int, int], ...] = ()   # host-tier blocks continuing `match`: (chain key, host slot)


@dataclass(slots=True)
class KVStats:
    """Engine-level counters (monotonic); `Engine.cache_stats()` exports them."""

    queried_tokens: int = 0       # tokens looked up in the prefix cache at admission
    hit_tokens: int = 0           # of those, served from the cache
    evicted_blocks: dict[str, int] = field(default_factory=lambda: {"capacity": 0, "ttl": 0, "quota": 0})
    swap_out_requests: int = 0
    swap_out_blocks: int = 0
    swap_in_requests: int = 0
    swap_in_blocks: int = 0
    swap_fallbacks: int = 0       # swap preemptions that had to recompute (tier full)
