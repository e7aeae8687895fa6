"""Builds a ModelExecutor from an EngineConfig: load weights, pick dtype and device, size the KV cache."""

from __future__ import annotations

import ctypes
import logging
import os
import sys

import torch

from pacer.config import DTYPES, EngineConfig
from pacer.model.executor import ModelExecutor
from pacer.model.llama import LlamaModel
from pacer.model.loader import Checkpoint, load_checkpoint

__all__ = ["build_model_executor", "resolve_dtype"]

log = logging.getLogger("pacer.model")

_DTYPES = {name: getattr(torch, name) for name in DTYPES}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return _DTYPES[name]


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_allocator_tuned = False


def tune_cpu_allocator() -> bool:
    """Keep large activation buffers in glibc's heap instead of fresh mmaps.

    A prefill step allocates and frees tens of MB per layer (projection outputs). By
    default glibc serves each from a new mmap and unmaps it on free, so every step pays
    page faults and zeroing for all of it (~10% of a 2048-token step here). Raising the
    mmap threshold to its maximum (32 MiB) and the trim threshold keeps that memory
    reused, the effect vLLM gets on CPU from preloading tcmalloc. Set PACER_TUNE_MALLOC=0
    to leave the allocator alone. Returns whether it applied."""
    global _allocator_tuned
    if _allocator_tuned or os.environ.get("PACER_TUNE_MALLOC", "1") == "0" or not sys.platform.startswith("linux"):
        return _allocator_tuned
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):  # not glibc
        ok = False
    if not ok:
        log.info("could not tune the C allocator (not glibc?); continuing with its defaults")
    _allocator_tuned = ok
    return ok


def build_model_executor(config: EngineConfig) -> tuple[ModelExecutor, Checkpoint, int]:
    mc = config.model
    if mc.device == "cpu":
        tune_cpu_allocator()
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
