"""Shared fixtures for tests on the real default model (SmolLM2-135M) outside tests/server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.model.runner import executor_for


@pytest.fixture(scope="module")
def base() -> Iterator[Engine]:
    """The default model, loaded once per module; `make` builds engines over it."""
    threads = torch.get_num_threads()
    yield Engine.from_kwargs(num_kv_blocks=256, num_threads=1)   # small batches: 1 thread is fastest
    torch.set_num_threads(threads)


def make(base: Engine, **kw: Any) -> Engine:
    """A fresh engine (own KV, own config) over the already loaded model."""
    cfg = EngineConfig.from_kwargs(**kw)
    if cfg.cache.num_kv_blocks is None and cfg.cache.kv_cache_memory is None:
        cfg.cache.num_kv_blocks = 256
    executor = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
    return Engine(cfg, executor, base.tokenizer, executor.num_blocks, base.max_model_len, base.eos_token_ids,
                  vocab_size=base.vocab_size)
