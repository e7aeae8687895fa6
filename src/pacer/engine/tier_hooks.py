"""The engine's hook for KV tiers that do I/O each step (the disk tier of `kv_offloading_dir`,
`pacer.kv.tiers.disk.DiskTier`): what `Engine.step()`, `Engine.shutdown()` and
`Engine.snapshot()` call, by name, where a reader of the step sees it.

A tier works on the engine's KV manager, which the engine makes; so the builder
(`pacer.engine.build.kv_tiers`) hands the engine factories, and the engine opens each tier
over its KV manager when it is constructed (the tier's start-up work, e.g. reading its files
back into the host tier, happens then).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    from pacer.kv.manager import KVCacheManager
    from pacer.sched.contract import SchedulerOutput

__all__ = ["KVTierHook", "KVTierFactory"]


class KVTierHook(Protocol):
    @property
    def name(self) -> str:
        """Its row in `EngineSnapshot.tiers` ."""
        ...

    def before_step(self, out: SchedulerOutput) -> None:
        """The step is planned (after `Scheduler.schedule()`, before its copies and forward run)."""
        ...

    def after_step(self) -> None:
        """The step's copies have run and its outputs are applied (after the scheduler's update)."""
        ...

    def flush(self) -> int:
        """Graceful shutdown: write what the tier should keep; returns how many blocks it wrote."""
        ...

    def stats(self) -> Mapping[str, float]:
        """The tier's row of the snapshot's `tiers` (blocks, usage, promotions, demotions, bytes)."""
        ...


KVTierFactory: TypeAlias = "Callable[[KVCacheManager], KVTierHook]"
