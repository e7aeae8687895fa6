"""The disk KV tier's block store on a real engine (`kv_offloading_dir`): KV blocks' bytes.

The tier's bookkeeping and its decisions (file format, identity check, restore order, which
blocks to write when) are `pacer.kv.tiers.disk`; this room only turns the model executor's
KV tensors into bytes and back (`ModelBlockStore`, the `pacer.kv.tiers.disk.BlockStore` of a
`ModelExecutor`) and says what a block file must match to be loaded (`kv_identity`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from pacer.model.executor import ModelExecutor

__all__ = ["ModelBlockStore", "kv_identity"]


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


class ModelBlockStore:
    """A `ModelExecutor`'s KV blocks as bytes, in `device_block`'s layout ([layers, 2 (K, V),
    *block], as stored)."""

    def __init__(self, executor: object) -> None:
        if not isinstance(executor, ModelExecutor):
            raise ValueError("kv_offloading_dir needs the model executor (it reads and writes KV tensors), "
                             f"got {type(executor).__name__}")
        self.executor = executor
        sample = executor.device_block(0)
        self._shape, self._dtype = tuple(sample.shape), sample.dtype
        self._identity = kv_identity(executor)

    @property
    def identity(self) -> dict[str, Any]:
        return self._identity

    def device_block(self, block_id: int) -> bytes:
        return _to_bytes(self.executor.device_block(block_id))

    def host_block(self, slot: int) -> bytes | None:
        block = self.executor.host_block(slot)
        return None if block is None else _to_bytes(block)

    def put_host_block(self, slot: int, data: bytes) -> None:
        block = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(self._dtype).reshape(self._shape)
        self.executor.put_host_block(slot, block)
