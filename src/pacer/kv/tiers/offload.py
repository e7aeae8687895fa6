"""Glue between the radix tree (the device tier) and the host tier (`kv_offloading_size`).
Pure Python.

When the tree drops blocks (capacity, ttl or quota eviction) they are demoted: the host tier
takes a copy, planned as a (device block, host slot) swap-out of the current step, which runs
before the blocks are written again. On admission, after the device tier's match, the host
tier is looked up for the blocks that continue it; a committed hit promotes them: fresh
device blocks, filled by (host slot, device block) copies that run after the step's
swap-outs and before its forward. Promoted blocks join the request's table like a device
hit and enter the tree as the request's computed blocks.

Chain keys follow the tree's path: each block is keyed under the owner of its node, so the
host tier isolates tenants exactly as the tree does.

Both implement `pacer.kv.interface.PrefixOffloadProtocol`: `PrefixOffload` when there is a host
tier and prefix caching, `NullOffload` (finds nothing, copies nothing) otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pacer.kv.events import SALT_SEPARATOR, BlockEventLog
from pacer.kv.interface import SwapPairs
from pacer.kv.prefix_cache import PrefixCache
from pacer.kv.radix_node import RadixNode
from pacer.kv.tiers.host import ROOT_KEY, HostKVTier, block_key

__all__ = ["PrefixOffload", "NullOffload", "path_keys", "tier_stats"]


def path_keys(node: RadixNode | None, block_size: int, last_blocks: int | None = None) -> list[int]:
    """Chain keys of the blocks on the tree path root..node; of `node` itself only its first
    `last_blocks` blocks when given."""
    nodes: list[RadixNode] = []
    n = node
    while n is not None and n.parent is not None:
        nodes.append(n)
        n = n.parent
    keys: list[int] = []
    parent = ROOT_KEY
    for nd in reversed(nodes):
        count = len(nd.block_ids) if nd is not node or last_blocks is None else last_blocks
        for i in range(count):
            parent = block_key(parent, nd.owner, nd.tokens[i * block_size:(i + 1) * block_size])
            keys.append(parent)
    return keys


class PrefixOffload:
    def __init__(self, host: HostKVTier, cache: PrefixCache) -> None:
        self.host = host
        self.block_size = cache.block_size
        cache.on_drop = self._on_drop
        self._out: SwapPairs = []                        # demotions of this step: (device, host)
        self._in: dict[str, SwapPairs] = {}              # promotions of this step, by request: (host, device)

    def _on_drop(self, node: RadixNode, take: int) -> None:
        keep = len(node.block_ids) - take
        keys = path_keys(node, self.block_size, keep)
        parent = keys[-1] if keys else ROOT_KEY
        tokens = node.tokens[keep * self.block_size:]
        tenant = node.owner.partition(SALT_SEPARATOR)[0]   # a salted namespace weighs as its tenant
        self._out.extend(self.host.demote(node.owner, tenant, parent, tokens, node.block_ids[keep:]))

    def lookup(self, matched: RadixNode | None, matched_blocks: int, token_ids: Sequence[int],
               owners: Sequence[str], max_blocks: int) -> list[tuple[int, int]]:
        """Host blocks continuing a device match of `matched_blocks` blocks ending at `matched`
        (None: no device hit): [(chain key, host slot)]. No side effects."""
        if max_blocks <= matched_blocks:
            return []
        keys = path_keys(matched, self.block_size) if matched is not None else []
        parent = keys[-1] if keys else ROOT_KEY
        bs = self.block_size
        return self.host.lookup(owners, parent, token_ids[matched_blocks * bs:], max_blocks - matched_blocks)

    def commit(self, request_id: str, hits: list[tuple[int, int]]) -> None:
        """Promote `hits` for this request: locked (and counted) now, before the device blocks
        they go to are allocated, since that allocation may evict and demote."""
        self.host.promote([k for k, _ in hits])
        self._in[request_id] = [(slot, -1) for _, slot in hits]

    def bind(self, request_id: str, device_blocks: Sequence[int]) -> None:
        """The device blocks of a committed promotion, one per hit, in order."""
        self._in[request_id] = [(slot, dev) for (slot, _), dev in zip(self._in[request_id], device_blocks)]

    def is_promoting(self, request_id: str) -> bool:
        """Whether the request has promotions in this step (its blocks are filled by them)."""
        return request_id in self._in

    def cancel(self, request_id: str, still_cached: Callable[[int], bool]) -> None:
        """The request lost its blocks in the step that promoted into them (preempted right
        after admission). Its promotions are not run (nor counted), except into device blocks
        the tree adopted (`still_cached`): those must be filled, and, held by the tree, they
        cannot be handed to anyone else this step."""
        pairs = self._in.pop(request_id, None)
        if not pairs:
            return
        kept = [(slot, dev) for slot, dev in pairs if still_cached(dev)]
        if kept:
            self._in[request_id] = kept
        dropped = len(pairs) - len(kept)
        self.host.stats.promotions -= dropped
        self.host.stats.hit_tokens -= dropped * self.block_size

    def pending_device_blocks(self) -> set[int]:
        """Device blocks whose promotion copy has not run yet (their KV is not there yet)."""
        return {dev for pairs in self._in.values() for _, dev in pairs if dev >= 0}

    def take_ops(self) -> tuple[SwapPairs, SwapPairs]:
        """This step's demotions and promotions; the host tier's step locks are released."""
        out, self._out = self._out, []
        ins = [pair for pairs in self._in.values() for pair in pairs]
        self._in.clear()
        self.host.end_step()
        return out, ins

    def record_events(self, log: BlockEventLog | None) -> None:
        """The host tier's events (medium CPU) go to the device tier's log."""
        self.host.events = log


class NullOffload:
    """No host tier behind the prefix cache (no `kv_offloading_size`, or no prefix caching):
    a look-up finds nothing there, so nothing is promoted, demoted or copied."""

    def lookup(self, matched: RadixNode | None, matched_blocks: int, token_ids: Sequence[int],
               owners: Sequence[str], max_blocks: int) -> list[tuple[int, int]]:
        return []

    def commit(self, request_id: str, hits: list[tuple[int, int]]) -> None:
        if hits:
            raise ValueError(f"request {request_id!r}: {len(hits)} host-tier hits to promote, but there is no host tier")

    def bind(self, request_id: str, device_blocks: Sequence[int]) -> None:
        if device_blocks:
            raise ValueError(f"request {request_id!r}: no promotion to bind device blocks to (no host tier)")

    def is_promoting(self, request_id: str) -> bool:
        return False

    def cancel(self, request_id: str, still_cached: Callable[[int], bool]) -> None:
        pass

    def pending_device_blocks(self) -> set[int]:
        return set()

    def take_ops(self) -> tuple[SwapPairs, SwapPairs]:
        return [], []

    def record_events(self, log: BlockEventLog | None) -> None:
        pass


def tier_stats(host: HostKVTier | None, num_device_blocks: int, device_cached_blocks: int, hit_tokens: int,
               block_bytes: int, device_usage: float = 0.0) -> dict[str, dict[str, float]]:
    """Per-tier view for EngineSnapshot.tiers: blocks, usage, hit tokens, promotions,
    demotions and bytes moved (host tier: copies each way; bytes_in = into the tier,
    bytes_out = out of it)."""
    host_hits = host.stats.hit_tokens if host else 0
    tiers: dict[str, dict[str, float]] = {"device": {
        "blocks": num_device_blocks, "cached_blocks": device_cached_blocks, "usage": device_usage,
        "hit_tokens": hit_tokens - host_hits}}
    if host is not None:
        s = host.stats
        tiers["host"] = {
            "blocks": host.num_blocks, "offloaded_blocks": host.num_offloaded_blocks, "swap_blocks": host.swap_slots,
            "usage": (host.num_offloaded_blocks + host.swap_slots) / host.num_blocks, "hit_tokens": host_hits,
            "promotions": s.promotions, "demotions": s.demotions, "evictions": sum(s.evictions.values()),
            "bytes_to_device": s.promotions * block_bytes, "bytes_to_host": s.demotions * block_bytes,
            "bytes_in": s.demotions * block_bytes, "bytes_out": s.promotions * block_bytes,
        }
    return tiers
