"""Builds a ModelExecutor from an EngineConfig: load weights, pick dtype and device, size the KV cache."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import Any

import torch

from pacer.config import DTYPES, CacheConfig, EngineConfig
from pacer.model.executor import ModelExecutor
from pacer.model.kv_quant import KVFormat
from pacer.model.llama import LlamaModel
from pacer.model.loader import (
    Checkpoint,
    load_checkpoint,
    quantize_checkpoint,
    resolve_quant_activations,
    resolve_quantization,
)

__all__ = ["build_model_executor", "executor_for", "resolve_dtype", "kv_capacity_line"]

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
    dtype = resolve_dtype(mc.dtype, mc.device)
    quantization = resolve_quantization(mc.quantization, mc.model, mc.device, dtype)
    activations = resolve_quant_activations(mc.quant_activations, quantization)
    ckpt = load_checkpoint(mc.model)
    quantize_checkpoint(ckpt, quantization)
    model = LlamaModel(ckpt.arch, ckpt.tensors, dtype=dtype, device=mc.device,
                       attention_backend=mc.attention_backend, linear_backend=mc.linear_backend,
                       quantized=ckpt.quantized, quant_activations=activations)
    log.info("weights: %s", model.weights_line())
    ckpt.tensors, ckpt.quantized = {}, {}  # the model holds its own (fused) copies
    executor = executor_for(model, config.cache, seed=mc.seed, tokenizer=ckpt.tokenizer)
    return executor, ckpt, executor.num_blocks


def executor_for(model: LlamaModel, cache: CacheConfig, seed: int = 0, tokenizer: Any = None) -> ModelExecutor:
    """A ModelExecutor over loaded weights with its own KV cache sized and stored as `cache` says
    (kv_cache_dtype, calculate_kv_scales, num_kv_blocks or kv_cache_memory); logs the capacity."""
    fmt = model.kv_format(cache.kv_cache_dtype)
    if cache.calculate_kv_scales:
        if tokenizer is None:
            raise ValueError("calculate_kv_scales needs the model's tokenizer for its warm-up text")
        from pacer.model.kv_calibrate import calibrate_fp8_scales

        fmt = calibrate_fp8_scales(model, fmt, tokenizer)
    a = model.arch
    num_blocks = cache.resolve_num_blocks(fmt.bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim))
    log.info("%s", kv_capacity_line(model, fmt, num_blocks, cache.block_size))
    return ModelExecutor(model, num_blocks, cache.block_size, seed=seed, kv_format=fmt)


def kv_capacity_line(model: LlamaModel, fmt: KVFormat, num_blocks: int, block_size: int) -> str:
    """'KV cache int8: N blocks (T tokens), B bytes/token; 1.94x the blocks of bfloat16, ...'."""
    a = model.arch
    per_token = fmt.bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim)
    ratios = []
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        ref = KVFormat("auto", dtype).bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim)
        ratios.append(f"{ref / per_token:.2f}x the blocks of {name} KV")
    name = fmt.name if fmt.quantized else f"auto ({str(model.dtype).removeprefix('torch.')})"
    return (f"KV cache {name}: {num_blocks} blocks ({num_blocks * block_size} tokens), {per_token} bytes/token; "
            f"in the same memory {', '.join(ratios)}")
