"""Shared fixtures for tests on the real default model (SmolLM2-135M) outside tests/server, and
the CI=true rule for the whole suite: a skipped test fails unless README.md names why it may skip."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from pacer.config import EngineConfig
from pacer.engine import Engine
from pacer.engine.build import kv_tiers
from pacer.llm import LLM
from pacer.model.runner import executor_for

# The suite never reads this machine's saved `pacer sim calibrate` fit (~/.cache/pacer/sim): the
# simulator's and the slo policy's predictions in tests are pacer's shipped fit's, wherever they run.
os.environ["PACER_SIM_CALIBRATION"] = os.path.join(tempfile.mkdtemp(prefix="pacer-sim-fit-"), "cpu-local.json")


@pytest.fixture(scope="session")
def base() -> Iterator[Engine]:
    """The default model, loaded once per test process (each xdist worker); `make` builds engines
    over it and `llm_over` offline APIs, so tests that only read the weights never load them again.
    Its weights are the dequantized float32 reference (`quantization="none"`), the path the HF
    parity checks compare; the packed default (`auto`: the GGUF's blocks, int8 activations) has
    its own tests in tests/model/test_quant_model.py."""
    threads = torch.get_num_threads()
    yield Engine.from_kwargs(num_kv_blocks=256, num_threads=1, quantization="none")   # 1 thread: small batches
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def llm(base: Engine) -> LLM:
    """The servers' and the security suite's LLM, over the session's loaded model (one torch
    thread: on 2 shared cores ~10x faster than two contending)."""
    return llm_over(base, kv_cache_memory="512MiB")


def llm_over(base: Engine, **kw: Any) -> LLM:
    """An `LLM` whose engine is `make(base, **kw)`: the offline API without loading the model again."""
    llm = LLM.__new__(LLM)
    llm.engine = make(base, **kw)
    llm.config = llm.engine.config
    return llm


def make(base: Engine, wrap: Callable[[Any], Any] | None = None, **kw: Any) -> Engine:
    """A fresh engine (own KV, own config, and its KV tiers: the disk tier with
    `kv_offloading_dir`) over the already loaded model; `wrap` wraps its executor (a test's
    fault injector: an engine's executor is never swapped)."""
    cfg = EngineConfig.from_kwargs(**kw)
    if cfg.cache.num_kv_blocks is None and cfg.cache.kv_cache_memory is None:
        cfg.cache.num_kv_blocks = 256
    executor: Any = executor_for(base.executor.model, cfg.cache, tokenizer=base.tokenizer)
    num_blocks = executor.num_blocks
    tiers = kv_tiers(cfg, executor)
    if wrap is not None:
        executor = wrap(executor)
    return Engine(cfg, executor, base.tokenizer, num_blocks, base.max_model_len, base.eos_token_ids,
                  vocab_size=base.vocab_size, tiers=tiers)


# ---------------------------------------------------------------- CI=true: no silent skips

_SKIP_SECTION = "### Tests that may skip"


def _allowed_skip_reasons() -> list[str]:
    """The skip reasons README.md's "Tests that may skip" section names (its `code` bullets)."""
    readme = Path(__file__).resolve().parent.parent / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.exists() else ""
    if _SKIP_SECTION not in text:
        return []
    section = text.split(_SKIP_SECTION, 1)[1].split("\n#", 1)[0]
    return re.findall(r"^- `([^`]+)`", section, flags=re.MULTILINE)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI=true a skipped test fails, unless README names its reason as one that may skip
    (a kernel that did not build, or a backend torch lacks, would otherwise pass CI unseen)."""
    outcome = yield
    report = outcome.get_result()   # type: ignore[attr-defined]
    if not report.skipped or os.environ.get("CI") != "true" or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if any(allowed in reason for allowed in _allowed_skip_reasons()):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true: {reason!r}; README.md's '{_SKIP_SECTION[4:]}' "
                       "does not name this reason, so it may not skip in CI")
