"""The disk KV tier on a real engine (`kv_offloading_dir`): the block files' bytes.

Bookkeeping (file format, identity check, restore order) is pacer.kv.tiers.disk; this room
moves tensors. Three moments:

- start-up (`DiskKVTier.attach`): the directory's block files that this model and KV format
  wrote are read back into the host tier (parents first, while it has free slots), so the
  first request after a restart is a host-tier hit: its blocks are promoted, not recomputed.
  Refused files (another model or KV format, truncated, corrupt) are counted and named in one
  start-up line; they are never loaded or overwritten.
- each step: blocks demoted to the host tier are written through to their files once the
  step that copied them to the host has run (the step's plan names their host slots).
- graceful shutdown (`flush`, from Engine.shutdown): the cached blocks of the faster tiers,
  the device's radix tree and the host tier, are written too.

Writes are synchronous, in the engine's thread, one small file per block.
"""

from __future__ import annotations

import hashlib
import sys
from typing import TYPE_CHECKING, Any

import torch

from pacer.kv.tiers.disk import BlockRecord, DiskTierIndex, restore_order
from pacer.kv.tiers.host import ROOT_KEY
from pacer.kv.tiers.offload import path_keys

if TYPE_CHECKING:
    from pacer.engine import Engine, StepStats
    from pacer.model.executor import ModelExecutor
    from pacer.sched.contract import SchedulerOutput

__all__ = ["DiskKVTier", "kv_identity"]


def kv_identity(executor: ModelExecutor) -> dict[str, Any]:
    """What a block file must match to be loaded: the model (its shape and a digest of its
    embedding weights), the KV format (dtype, fp8 scales) and the block layout."""
    model, fmt = executor.model, executor.kv_format
    digest = hashlib.sha256(repr(model.arch).encode())
    digest.update(model.embed[:16].float().cpu().contiguous().numpy().tobytes())
    block = executor.device_block(0)
    return {"format": 1, "model": digest.hexdigest()[:16], "model_dtype": str(model.dtype),
            "kv_cache_dtype": fmt.name, "storage": str(fmt.storage), "k_scales": list(fmt.k_scales),
            "v_scales": list(fmt.v_scales), "block_shape": list(block.shape)}


def _to_bytes(block: torch.Tensor) -> bytes:
    return bytes(block.contiguous().view(torch.uint8).numpy().tobytes())


class DiskKVTier:
    def __init__(self, engine: Engine, directory: str) -> None:
        host = engine.kv.host_tier
        if host is None or engine.kv.cache is None:
            raise ValueError("kv_offloading_dir needs the host tier (kv_offloading_size) and prefix caching")
        executor: Any = engine.executor
        if not hasattr(executor, "device_block"):
            raise ValueError("kv_offloading_dir needs the model executor (it reads and writes KV tensors)")
        self.engine, self.host, self.executor = engine, host, executor
        self.block_size = engine.kv.block_size
        self.index = DiskTierIndex(directory, kv_identity(executor))
        sample = executor.device_block(0)
        self._shape, self._dtype = tuple(sample.shape), sample.dtype
        self._pending: list[int] = []            # demoted keys whose host copy may not have run yet
        self._planned: list[int] = []            # of those, the ones known when this step was planned
        self._copied: set[int] = set()           # host slots the step being run copies into
        host.new_keys = []

    @classmethod
    def attach(cls, engine: Engine, directory: str) -> DiskKVTier:
        tier = cls(engine, directory)
        restored = tier.restore()
        engine.schedule_listeners.append(tier._before_step)
        engine.stats_listeners.append(tier._after_step)
        engine.disk_tier = tier
        s = tier.index.stats
        refused = f"; refused {s.refused} file(s): " + " | ".join(s.refusals) if s.refused else ""
        print(f"[pacer] disk KV tier {directory}: {len(tier.index.keys)} block file(s), {restored} read back "
              f"into the host tier{refused}", file=sys.stderr)
        return tier

    # ------------------------------------------------------------------ start-up

    def restore(self) -> int:
        """Read this engine's block files back into free host slots, parents first."""
        found = self.index.scan()
        payloads = {rec.key: payload for rec, payload in found}
        n = 0
        for rec in restore_order([r for r, _ in found], ROOT_KEY):
            slot = self.host.adopt(rec.key, rec.parent, rec.owner, rec.tokens)
            if slot is None:
                if not self.host.pool.num_free_blocks:
                    break
                continue
            payload = payloads[rec.key]
            block = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(self._dtype).reshape(self._shape)
            self.executor.put_host_block(slot, block)
            self.index.stats.loaded += 1
            self.index.stats.bytes_read += len(payload)
            n += 1
        return n

    # ------------------------------------------------------------------ each step

    def _before_step(self, out: SchedulerOutput) -> None:
        """The plan is made: blocks demoted until now have their host copy in this step or
        later; ones demoted after this (while the step runs or updates) wait for the next plan."""
        assert self.host.new_keys is not None
        if self._planned:          # the previous step ran only copies (no stats, no _after_step)
            self._write_planned()
        self._planned = self._pending + self.host.new_keys
        self.host.new_keys.clear()
        self._copied = {slot for _, slot in out.swap_out}

    def _after_step(self, stats: StepStats) -> None:
        self._write_planned()

    def _write_planned(self) -> None:
        keep: list[int] = []
        for key in self._planned:
            entry = self.host.entry(key)
            if entry is None or key in self.index.keys:
                continue                          # evicted again already, or on disk
            if entry[0] in self._copied:
                self._write_host(key, *entry)
            else:
                keep.append(key)                  # demoted after this step's plan: its copy is next
        self._pending, self._planned = keep, []
        self._copied = set()

    def _write_host(self, key: int, slot: int, parent: int, owner: str, tokens: tuple[int, ...]) -> None:
        block = self.executor.host_block(slot)
        if block is not None:
            self.index.write(BlockRecord(key, parent, owner, tokens), _to_bytes(block))

    # ------------------------------------------------------------------ shutdown

    def flush(self) -> int:
        """Write the device tree's and the host tier's cached blocks not on disk yet; returns
        how many files were written."""
        before = self.index.stats.written
        cache = self.engine.kv.cache
        assert cache is not None
        bs = self.block_size
        unfilled = self.engine.kv.offload.pending_device_blocks() if self.engine.kv.offload else set()
        for node in cache.iter_nodes():
            keys = path_keys(node, bs)
            own = keys[len(keys) - len(node.block_ids):]
            parent = keys[len(keys) - len(node.block_ids) - 1] if len(keys) > len(node.block_ids) else ROOT_KEY
            for i, (key, block_id) in enumerate(zip(own, node.block_ids)):
                if key not in self.index.keys and block_id not in unfilled:
                    rec = BlockRecord(key, parent, node.owner, tuple(node.tokens[i * bs:(i + 1) * bs]))
                    self.index.write(rec, _to_bytes(self.executor.device_block(block_id)))
                parent = key
        pending = set(self._pending) | set(self._planned) | set(self.host.new_keys or ())
        for key, slot, parent, owner, tokens in self.host.entries():
            if key not in self.index.keys and key not in pending:
                self._write_host(key, slot, parent, owner, tokens)
        return self.index.stats.written - before
