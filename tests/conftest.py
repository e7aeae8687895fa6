"""Shared fixtures for tests on the real default model (SmolLM2-135M) outside tests/server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.model.executor import ModelExecutor


@pytest.fixture(scope="module")
def base() -> Iterator[Engine]:
    """The default model, loaded once per module; `make` builds engines over it."""
    threads = torch.get_num_threads()
    yield Engine.from_kwargs(num_kv_blocks=256, num_threads=1)   # small batches: 1 thread is fastest
    torch.set_num_threads(threads)


def make(base: Engine, wrap: Callable[[Any], Any] | None = None, **kw: Any) -> Engine:
    """A fresh engine (own KV, own config) over the already loaded model; `wrap` wraps its
    executor (a test's fault injector: an engine's executor is never swapped)."""
    cfg = EngineConfig.from_kwargs(**kw)
    num_blocks = cfg.cache.num_kv_blocks or 256
    executor: Any = ModelExecutor(base.executor.model, num_blocks, cfg.cache.block_size)
    if wrap is not None:
        executor = wrap(executor)
    return Engine(cfg, executor, base.tokenizer, num_blocks, base.max_model_len, base.eos_token_ids,
                  vocab_size=base.vocab_size)
