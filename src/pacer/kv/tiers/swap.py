"""The CPU swap tier of `preemption_mode="swap"`: which CPU slots hold each swapped-out
request's KV, and the copies the current step must run. Pure Python, no tensors.

Its slots come from a pool of its own (`num_cpu_blocks`) or, with a host tier
(`kv_offloading_size`), from the host pool it shares with the prefix offload tier
(`SwapSlots`: a swap-out may evict offloaded blocks, never the reverse).

The KV manager owns one (`KVCacheManager.swap`); it decides who is swapped, the tier only
keeps the slots. Copies are planned during `schedule()` and handed to the executor in the
step's `SchedulerOutput` by `take_ops`: swap-outs (device block, CPU slot) first, then
swap-ins (CPU slot, device block).
"""

from __future__ import annotations

from collections.abc import Sequence

from pacer.kv.block_pool import BlockPool, OutOfBlocksError
from pacer.kv.interface import SwapPairs
from pacer.kv.tiers.host import HostKVTier

__all__ = ["CpuSwapTier", "SwapPairs", "SwapSlots"]


class CpuSwapTier:
    def __init__(self, num_blocks: int, host_tier: HostKVTier | None = None) -> None:
        self.pool: BlockPool | SwapSlots | None = (
            SwapSlots(host_tier) if host_tier is not None else BlockPool(num_blocks) if num_blocks > 0 else None)
        self._swapped: dict[str, list[int]] = {}       # request id -> CPU slots holding its KV
        self.held_ids = self._swapped.keys()            # a live view: `rid in held_ids` is `holds(rid)`, no call
        self._pending_in: dict[str, SwapPairs] = {}     # swap-ins decided this step: (cpu, device)
        self._pending_out: SwapPairs = []               # swap-outs decided this step: (device, cpu)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks if self.pool else 0

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used_blocks if self.pool else 0

    def holds(self, request_id: str) -> bool:
        """Whether the request's KV is (still, or being restored from) on the CPU tier."""
        return request_id in self._swapped

    def is_swapping_in(self, request_id: str) -> bool:
        return request_id in self._pending_in

    def reserve(self, request_id: str, device_blocks: list[int]) -> bool:
        """Plan the copy of `device_blocks` to fresh CPU slots; False (nothing changed) when
        the tier cannot hold them."""
        n = len(device_blocks)
        if self.pool is None or self.pool.num_free_blocks < n:
            return False
        cpu = self.pool.allocate(n)
        self._pending_out.extend(zip(device_blocks, cpu))
        self._swapped[request_id] = cpu
        return True

    def cancel_swap_in(self, request_id: str) -> None:
        """A request resumed earlier in this step is preempted again: its KV stays on the CPU."""
        del self._pending_in[request_id]

    def plan_swap_in(self, request_id: str, device_blocks: list[int]) -> None:
        """The request got device blocks again: restore its KV into them (once per resume)."""
        cpu = self._swapped.get(request_id)
        if cpu is not None and request_id not in self._pending_in:
            self._pending_in[request_id] = list(zip(cpu, device_blocks))

    def drop(self, request_id: str) -> bool:
        """Forget the request (finished or aborted); returns whether its device blocks were
        still waiting for their swap-in (so they hold no KV yet)."""
        swapping_in = self._pending_in.pop(request_id, None) is not None
        cpu = self._swapped.pop(request_id, None)
        if cpu is not None and self.pool is not None:
            self.pool.free(cpu)
        return swapping_in

    def take_ops(self) -> tuple[SwapPairs, dict[str, SwapPairs]]:
        """The step's copies: swap-outs, and swap-ins by request. Swapped-in CPU slots are
        released here."""
        out, self._pending_out = self._pending_out, []
        ins, self._pending_in = self._pending_in, {}
        for rid in ins:
            cpu = self._swapped.pop(rid)
            if self.pool is not None:
                self.pool.free(cpu)
        return out, ins

    def check_invariants(self) -> None:
        if self.pool is None:
            return
        self.pool.check_invariants()
        used = sum(len(c) for c in self._swapped.values())
        if used != self.pool.num_used_blocks:
            raise AssertionError(f"CPU tier: {self.pool.num_used_blocks} used, {used} held")


class SwapSlots:
    """The host tier seen by swap preemption: BlockPool's interface over the shared pool
    (free means free or held by an offloaded block a swap-out may evict)."""

    def __init__(self, tier: HostKVTier) -> None:
        self.tier = tier

    @property
    def num_blocks(self) -> int:
        return self.tier.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.tier.available_for_swap()

    @property
    def num_used_blocks(self) -> int:
        return self.tier.swap_slots

    def allocate(self, n: int) -> list[int]:
        slots = self.tier.allocate_swap(n)
        if slots is None:
            raise OutOfBlocksError(f"asked for {n} host slots, {self.tier.available_for_swap()} available")
        return slots

    def free(self, slots: Sequence[int]) -> int:
        self.tier.free_swap(slots)
        return len(slots)

    def check_invariants(self) -> None:
        self.tier.check_invariants()
