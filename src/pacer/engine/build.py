"""How an engine is built from a config: the model executor (`pacer.model.runner`), the step-cost
model the scheduler predicts with (from `pacer.perf`: this machine's fit or a profile, corrected by
a start-up calibration on the executor), and the KV tiers that do I/O (the disk tier,
`pacer.kv.tiers.disk` over the executor's `pacer.model.kv_io.ModelBlockStore`).

The engine itself never makes a cost model, an executor or a tier: `Engine.from_config` takes
the parts built here (`build_parts`) and hands them to the constructor, so this module never
imports the engine. Tests and the simulator build an `Engine` directly over their own executor
and cost model (and `kv_tiers(config, executor)` when they want the disk tier).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pacer.config import EngineConfig
from pacer.config.cache import parse_memory_size
from pacer.engine.tier_hooks import KVTierFactory
from pacer.kv.tiers.disk import DiskTier
from pacer.perf.cost_model import make_cost_model
from pacer.perf.default_calibration import DEFAULT_CPU_CALIBRATION
from pacer.perf.profiles import (
    ModelProfile,
    calibration_path,
    fit_is_trusted,
    get_hardware,
    get_model,
    model_from_hf_config,
)
from pacer.perf.startup_calibration import calibrate_at_startup, calibration_key
from pacer.perf.step_model import SchedulerCostModel
from pacer.sched.contract import Executor

__all__ = ["EngineParts", "build_parts", "kv_tiers", "step_cost_model", "needs_cost_model"]

log = logging.getLogger("pacer.engine")


def needs_cost_model(config: EngineConfig) -> bool:
    """Whether the scheduler predicts step times: the slo policy, or adaptive speculation."""
    sc = config.scheduler
    adaptive_spec = sc.speculative_config is not None and sc.speculative_policy == "adaptive"
    return sc.scheduling_policy == "slo" or adaptive_spec


@dataclass(frozen=True, slots=True)
class EngineParts:
    """What `Engine(...)` is constructed from, besides the config and the clock."""

    executor: Executor
    tokenizer: Any
    num_kv_blocks: int
    model_max_len: int
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    cost_model: SchedulerCostModel | None
    tiers: Sequence[KVTierFactory]


def build_parts(config: EngineConfig) -> EngineParts:
    """The parts of an engine on the model `config` names: executor, cost model (when the
    scheduler needs one) and KV tiers."""
    from pacer.model.runner import build_model_executor

    executor, ckpt, num_blocks = build_model_executor(config)
    cost_model = step_cost_model(config, ckpt.arch, executor, num_blocks) if needs_cost_model(config) else None
    return EngineParts(executor, ckpt.tokenizer, num_blocks, ckpt.arch.max_position_embeddings,
                       tuple(ckpt.arch.eos_token_ids), ckpt.arch.vocab_size, cost_model, kv_tiers(config, executor))


def kv_tiers(config: EngineConfig, executor: Executor) -> list[KVTierFactory]:
    """The KV tiers that do I/O each step, for `Engine(tiers=...)`: the disk tier when
    `kv_offloading_dir` is set (over the model executor's blocks), else none."""
    directory = config.cache.kv_offloading_dir
    if not directory:
        return []
    from pacer.model.kv_io import ModelBlockStore

    store = ModelBlockStore(executor)
    cache = config.cache
    max_bytes = None if cache.kv_offloading_dir_size is None else parse_memory_size(
        cache.kv_offloading_dir_size, "kv_offloading_dir_size")
    key = None
    if cache.kv_offloading_dir_key_file is not None:
        with open(cache.kv_offloading_dir_key_file, "rb") as f:
            key = f.read().strip()
        if not key:
            raise ValueError(f"kv_offloading_dir_key_file {cache.kv_offloading_dir_key_file} is empty")
    return [lambda kv: DiskTier.open(kv, directory, store, max_bytes, key)]


def step_cost_model(config: EngineConfig, arch: Any, executor: Executor | None = None,
                    num_blocks: int = 0) -> SchedulerCostModel:
    """The real engine's predictor: this machine's `pacer sim calibrate` fit when it was made for
    this model, dtype and thread count; else the fit shipped with pacer (CPU) or the h100-sxm
    roofline, corrected by a start-up calibration on `executor` (seconds, cached: see
    `pacer.perf.startup_calibration`); refitted online from measured steps either way."""
    model = _model_profile(config, arch)
    on_cpu = config.model.device == "cpu"
    hw = get_hardware("cpu-local" if on_cpu else "h100-sxm")
    if on_cpu and not fit_is_trusted(hw.calibration):   # a noisy saved fit: the shipped one, scaled at start-up
        log.warning("scheduling_policy=slo: the saved calibration %s is noisy (its fit: %s); predicting with "
                    "pacer's shipped fit, scaled at start-up; run `pacer sim calibrate` again on a quiet machine",
                    calibration_path(), (hw.calibration or {}).get("fit"))
        hw = dataclasses.replace(hw, calibration=DEFAULT_CPU_CALIBRATION)
    dtype = "float32" if config.model.dtype == "auto" and on_cpu else (
        "bfloat16" if config.model.dtype == "auto" else config.model.dtype)
    threads = config.model.num_threads or _torch_threads()
    cm = SchedulerCostModel(make_cost_model(hw, model, dtype, 1, config.cache.block_size), refit=True)
    calib = hw.calibration or {}
    weights = _weights_line(executor)
    if on_cpu and calib is not DEFAULT_CPU_CALIBRATION and calibration_path().is_file() \
            and (calib.get("model"), calib.get("dtype"), calib.get("threads")) \
            == (model.name, dtype, threads) and (weights is None or calib.get("weights") == weights):
        log.info("scheduling_policy=slo: predicting step times with %s (%s), refitted online", cm.base.name,
                 calibration_path())
        return cm
    how = "`pacer sim calibrate` makes a full fit of this machine"
    if executor is None:
        log.warning("scheduling_policy=slo: no calibration of this machine for %s %s x%d threads; predicting "
                    "with %s, refitted online from measured steps; %s", model.name, dtype, threads, cm.base.name, how)
        return cm
    key = calibration_key(device=config.model.device, model=model.name, dtype=dtype, threads=threads,
                          base=cm.base.name, weights=weights or "")
    entry = calibrate_at_startup(cm, executor, key=key, block_size=config.cache.block_size, num_blocks=num_blocks)
    scales = ", ".join(f"{k} x{v:.2f}" for k, v in cm.scale.items())
    if entry["cached"]:
        log.info("scheduling_policy=slo: start-up calibration read from %s (%s of %s)", entry["path"], scales,
                 cm.base.name)
    else:
        log.warning("scheduling_policy=slo: no calibration of this machine for %s %s x%d threads; timed %d steps "
                    "in %.1fs: %s of %s, cached at %s, refitted online while serving; %s", model.name, dtype,
                    threads, len(entry["samples"]), entry["seconds"], scales, cm.base.name, entry["path"], how)
    return cm


def _weights_line(executor: Executor | None) -> str | None:
    """What the executor's projections run (float32 or packed blocks, the kernel path), so a fit
    made for one is not used for the other; None when it cannot tell (no executor, a fake)."""
    line = getattr(getattr(executor, "model", None), "weights_line", None)
    return line() if callable(line) else None


def _model_profile(config: EngineConfig, arch: Any) -> ModelProfile:
    try:
        return get_model(config.model.model)
    except ValueError:
        return model_from_hf_config({
            "hidden_size": arch.hidden_size, "num_attention_heads": arch.num_heads,
            "num_hidden_layers": arch.num_layers, "intermediate_size": arch.intermediate_size,
            "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim, "vocab_size": arch.vocab_size,
            "max_position_embeddings": arch.max_position_embeddings,
            "tie_word_embeddings": arch.tie_word_embeddings}, arch.name or "model")


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())
