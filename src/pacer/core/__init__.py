"""pacer.core: the scheduler and KV bookkeeping. Standard library only (no torch, numpy,
asyncio): the same objects run the real engine and the simulator."""

from pacer.core.block_pool import BlockPool, OutOfBlocksError
from pacer.core.kv_manager import KVCacheManager
from pacer.core.outputs import ScheduledRequest, SchedulerOutput
from pacer.core.policy import Policy, make_policy
from pacer.core.scheduler import Scheduler

__all__ = [
    "BlockPool", "OutOfBlocksError", "KVCacheManager", "ScheduledRequest", "SchedulerOutput",
    "Policy", "make_policy", "Scheduler",
]
