"""Builds a ModelExecutor from an EngineConfig: load weights, pick dtype and device, size the KV cache."""

from __future__ import annotations

import torch

from pacer.config import EngineConfig
from pacer.executor.model_executor import ModelExecutor
from pacer.model.llama import LlamaModel
from pacer.model.loader import Checkpoint, load_checkpoint

__all__ = ["build_model_executor", "resolve_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return _DTYPES[name]


def build_model_executor(config: EngineConfig) -> tuple[ModelExecutor, Checkpoint, int]:
    mc = config.model
    if mc.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={mc.device!r} but torch reports no CUDA device")
    if mc.num_threads is not None:
        torch.set_num_threads(mc.num_threads)
    ckpt = load_checkpoint(mc.model)
    dtype = resolve_dtype(mc.dtype, mc.device)
    model = LlamaModel(ckpt.arch, ckpt.tensors, dtype=dtype, device=mc.device,
                       attention_backend=mc.attention_backend, linear_backend=mc.linear_backend)
    ckpt.tensors = {}  # the model holds its own (fused) copies
    num_blocks = config.cache.resolve_num_blocks(model.kv_bytes_per_token)
    executor = ModelExecutor(model, num_blocks, config.cache.block_size, seed=mc.seed)
    return executor, ckpt, num_blocks
