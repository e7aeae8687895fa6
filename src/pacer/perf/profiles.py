"""Hardware and model profiles for the simulator: plain numbers, no torch.

Hardware figures are datasheet peaks (dense, no sparsity) times an efficiency factor: what a
serving engine reaches on large GEMMs and on streaming HBM reads. `cpu-local` is this
machine: measured rooflines, plus step-time coefficients fitted by `pacer sim calibrate`
(see `pacer.sim.calibrate`). Models are described by their decoder shape; any HF
`config.json` path works too.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "HardwareProfile", "ModelProfile", "HARDWARE", "MODELS", "get_hardware", "get_model",
    "dtype_bytes", "kv_capacity_blocks", "kv_head_bytes", "weight_bytes_per_param", "WEIGHT_DTYPES",
    "weight_dtype_for",
]

_GB = 1000**3
_GIB = 1024**3

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


def dtype_bytes(dtype: str) -> int:
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPE_BYTES)}; got {dtype!r}") from None


# Bytes per weight a decode step reads, as pacer's packed kernels store them (pacer.model.quant):
# blocks of 32 values with a float32 scale (and a float32 offset for 4-bit blocks).
_WEIGHT_BYTES = {"q4_0": (16 + 8) / 32, "q4_1": (16 + 8) / 32, "q8_0": (32 + 4) / 32, "int8": (32 + 4) / 32}
WEIGHT_DTYPES = ("auto", *_WEIGHT_BYTES)


def weight_bytes_per_param(weight_dtype: str, dtype: str) -> float:
    """Bytes per projection weight: the model's dtype (auto) or a packed quantized format."""
    if weight_dtype == "auto":
        return float(dtype_bytes(dtype))
    try:
        return _WEIGHT_BYTES[weight_dtype]
    except KeyError:
        raise ValueError(f"weight_dtype must be one of {', '.join(WEIGHT_DTYPES)}; got {weight_dtype!r}") from None


def weight_dtype_for(quantization: str) -> str:
    """The weight dtype `pacer sim` prices for an engine's `quantization` (gguf: the Q4_1 blocks the
    default model ships in)."""
    return {"gguf": "q4_1", "int8": "int8"}.get(quantization, "auto")


def kv_head_bytes(head_dim: int, dtype: str, kv_cache_dtype: str = "auto") -> int:
    """Bytes of one token's K (or V) for one kv head as pacer stores it (pacer.model.kv_quant):
    the model's dtype, int8 plus a 2-byte scale, or one byte per value for fp8."""
    if kv_cache_dtype == "auto":
        return head_dim * dtype_bytes(dtype)
    if kv_cache_dtype == "int8":
        return head_dim + 2
    if kv_cache_dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        return head_dim
    raise ValueError(f"kv_cache_dtype must be one of auto, int8, fp8, fp8_e4m3, fp8_e5m2; got {kv_cache_dtype!r}")


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One accelerator (per device; tensor parallelism multiplies it)."""

    name: str
    memory_bytes: int
    peak_flops: dict[str, float]          # dense FLOP/s by dtype
    mem_bandwidth: float                  # bytes/s
    compute_efficiency: float = 0.7       # fraction of peak reached on large GEMMs
    bandwidth_efficiency: float = 0.85    # fraction of peak reached streaming weights / KV
    link_bandwidth: float = 0.0           # bytes/s per direction per device (NVLink)
    host_link_bandwidth: float = 25e9     # bytes/s device <-> host (PCIe), for swap preemption
    allreduce_latency_s: float = 8e-6     # fixed cost of one all-reduce
    step_overhead_s: float = 3e-4         # scheduling, launch, sampling: per step
    seq_overhead_s: float = 2e-6          # per scheduled sequence (metadata, sampling)
    default_dtype: str = "bfloat16"
    reserve_bytes: int = 2 * _GIB         # activations, CUDA context, graphs
    is_cpu: bool = False
    calibration: dict[str, Any] | None = field(default=None, compare=False)  # fitted step-time model

    def flops(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ValueError(f"hardware {self.name!r} has no peak for dtype {dtype!r}; "
                             f"known: {', '.join(self.peak_flops)}")
        return self.peak_flops[dtype]


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Shape of a Llama-family decoder: enough to count FLOPs and bytes."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_model_len: int
    tie_word_embeddings: bool = False

    @property
    def layer_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        qkv = h * (self.num_heads + 2 * self.num_kv_heads) * d
        o = self.num_heads * d * h
        mlp = 3 * h * self.intermediate_size
        return qkv + o + mlp

    @property
    def num_params(self) -> int:
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * self.layer_params + embed + head

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def weight_bytes(self, dtype: str) -> int:
        return self.num_params * dtype_bytes(dtype)

    def kv_bytes_per_token(self, dtype: str, tp: int = 1, kv_cache_dtype: str = "auto") -> int:
        """KV bytes per token on one device; KV heads are split by tp (replicated when tp > heads).
        `kv_cache_dtype` int8 / fp8 prices the quantized cache (scales included)."""
        kv_heads = max(1, -(-self.num_kv_heads // tp))
        return 2 * self.num_layers * kv_heads * kv_head_bytes(self.head_dim, dtype, kv_cache_dtype)


def _gpu(name: str, mem: int, bf16: float, bw: float, link: float, pcie: float) -> HardwareProfile:
    return HardwareProfile(name=name, memory_bytes=mem,
                           peak_flops={"bfloat16": bf16, "float16": bf16, "fp8": 2 * bf16, "float32": bf16 / 2},
                           mem_bandwidth=bw, link_bandwidth=link, host_link_bandwidth=pcie)


HARDWARE: dict[str, HardwareProfile] = {
    # A100 SXM 80GB: 312 TFLOP/s bf16 dense, 2,039 GB/s HBM2e, NVLink3 600 GB/s bidirectional
    # host links: PCIe Gen4 x16 (A100), Gen5 x16 (H100, H200, B200), at ~80% of 32 / 64 GB/s
    "a100-80g": _gpu("a100-80g", 80 * _GIB, 312e12, 2.039e12, 300e9, 25e9),
    # H100 SXM: 989 TFLOP/s bf16 dense, 3.35 TB/s HBM3, NVLink4 900 GB/s bidirectional
    "h100-sxm": _gpu("h100-sxm", 80 * _GIB, 989e12, 3.35e12, 450e9, 50e9),
    # H200 SXM: H100 compute, 141 GB HBM3e at 4.8 TB/s
    "h200-sxm": _gpu("h200-sxm", 141 * _GB, 989e12, 4.8e12, 450e9, 50e9),
    # B200 (HGX): 2.25 PFLOP/s bf16 dense, 180 GB HBM3e at 8 TB/s, NVLink5 1.8 TB/s bidirectional
    "b200": _gpu("b200", 180 * _GB, 2.25e15, 8.0e12, 900e9, 50e9),
}

MODELS: dict[str, ModelProfile] = {
    "llama-3.1-8b": ModelProfile("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256, 131072),
    "llama-3-8b": ModelProfile("llama-3-8b", 32, 4096, 14336, 32, 8, 128, 128256, 8192),
    "llama-3.1-70b": ModelProfile("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 128256, 131072),
    "qwen2.5-72b": ModelProfile("qwen2.5-72b", 80, 8192, 29568, 64, 8, 128, 152064, 32768),
    "qwen3-32b": ModelProfile("qwen3-32b", 64, 5120, 25600, 64, 8, 128, 151936, 40960),
    "smollm2-135m": ModelProfile("smollm2-135m", 30, 576, 1536, 9, 3, 64, 49152, 8192, tie_word_embeddings=True),
}

# This machine (2-core AMD EPYC, AVX-512 BF16): rooflines measured with torch (shared/peers/README).
# `calibration` is replaced by `pacer sim calibrate` (saved to ~/.cache/pacer/sim/cpu-local.json).
_CPU_LOCAL = HardwareProfile(
    name="cpu-local", memory_bytes=8 * _GIB, peak_flops={"float32": 170e9, "bfloat16": 396e9},
    mem_bandwidth=58e9, compute_efficiency=1.0, bandwidth_efficiency=1.0, step_overhead_s=2e-3,
    host_link_bandwidth=10e9,   # "swap" on a CPU is a copy between two tensors in RAM
    seq_overhead_s=1e-4, default_dtype="float32", reserve_bytes=0, is_cpu=True,
)


TRUSTED_FIT_ERROR = 0.15     # a saved fit whose engine steps' median error is above this is not trusted
TRUSTED_FIT_P90_ERROR = 0.15  # ... nor one whose executor samples' p90 error is above this


def fit_is_trusted(calib: dict[str, Any] | None) -> bool:
    """Whether a saved `pacer sim calibrate` fit is fit to predict this machine's steps: its
    engine steps' median relative error within TRUSTED_FIT_ERROR and its executor samples' p90
    within TRUSTED_FIT_P90_ERROR. Fits made on a busy machine missed by 8-45% (median) and
    55-92% (p90) here, a quiet one by 4% and 8.5%; a scheduler planning with a noisy one
    misjudged every target (a few spiked samples made its attention term 50x too large). A p90
    of 19% is a skewed fit, not a noisy one: two such fits on the AVX2 machine priced a 2,040-token
    prefill 25-30% above a 16-30-token one against what both took (the slo policy's long steps
    against its short ones); a fit at 9.6% priced them within about 10%."""
    c = calib or {}
    median = (c.get("engine_fit") or {}).get("median_rel_err")
    p90 = (c.get("fit") or {}).get("p90_rel_err")
    return (median is None or float(median) <= TRUSTED_FIT_ERROR) and (p90 is None or float(p90) <= TRUSTED_FIT_P90_ERROR)


def calibration_path() -> Path:
    """Where `pacer sim calibrate` saves this machine's fit: `$PACER_SIM_CALIBRATION`, else
    ~/.cache/pacer/sim/cpu-local.json (read at call time)."""
    env = os.environ.get("PACER_SIM_CALIBRATION")
    return Path(env) if env else Path.home() / ".cache" / "pacer" / "sim" / "cpu-local.json"


def get_hardware(name_or_path: str) -> HardwareProfile:
    """A built-in name, `cpu-local` (calibrated if a calibration exists), or a profile JSON path."""
    if name_or_path == "cpu-local":
        from pacer.perf.default_calibration import DEFAULT_CPU_CALIBRATION

        path = calibration_path()
        calib = json.loads(path.read_text()) if path.is_file() else DEFAULT_CPU_CALIBRATION
        return dataclasses.replace(_CPU_LOCAL, calibration=calib)
    if name_or_path in HARDWARE:
        return HARDWARE[name_or_path]
    p = Path(name_or_path)
    if p.suffix == ".json" and p.is_file():
        data = json.loads(p.read_text())
        if "coefficients" in data:   # a calibration file for this machine
            return dataclasses.replace(_CPU_LOCAL, calibration=data)
        return HardwareProfile(**data)
    raise ValueError(f"hardware must be one of {', '.join([*HARDWARE, 'cpu-local'])} or a profile .json path; "
                     f"got {name_or_path!r}")


def get_model(name_or_path: str | None) -> ModelProfile:
    """A built-in name (None: the default model, smollm2-135m) or an HF config.json / model directory."""
    if name_or_path is None:
        return MODELS["smollm2-135m"]
    key = name_or_path.lower()
    if key in MODELS:
        return MODELS[key]
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.name.endswith(".json") and p.is_file():
        return model_from_hf_config(json.loads(p.read_text()), p.parent.name or p.stem)
    if p.suffix == ".gguf" and p.is_file() and "smollm2-135m" in p.name.lower():
        return MODELS["smollm2-135m"]
    raise ValueError(f"model must be one of {', '.join(MODELS)} or an HF config.json / model directory; "
                     f"got {name_or_path!r}")


def model_from_hf_config(c: dict[str, Any], name: str) -> ModelProfile:
    try:
        hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        return ModelProfile(
            name=name, num_layers=int(c["num_hidden_layers"]), hidden_size=hidden,
            intermediate_size=int(c["intermediate_size"]), num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads), vocab_size=int(c["vocab_size"]),
            max_model_len=int(c.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        )
    except KeyError as e:
        raise ValueError(f"config.json of {name!r} lacks {e.args[0]!r}") from None


def kv_capacity_blocks(hw: HardwareProfile, model: ModelProfile, dtype: str, tp: int, block_size: int,
                       gpu_memory_utilization: float, kv_cache_dtype: str = "auto") -> int:
    """KV blocks as a real engine sizes them: (memory x utilisation - weights - reserve) / block bytes,
    per device (weights and KV heads are split by tp)."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    weights = model.weight_bytes(dtype) / tp
    free = hw.memory_bytes * gpu_memory_utilization - weights - hw.reserve_bytes
    block_bytes = model.kv_bytes_per_token(dtype, tp, kv_cache_dtype) * block_size
    n = int(free // block_bytes)
    if n < 1:
        raise ValueError(
            f"{model.name} ({weights / _GB:.1f} GB of {dtype} weights per device at tp={tp}) does not fit "
            f"{hw.name} ({hw.memory_bytes / _GB:.0f} GB x gpu_memory_utilization={gpu_memory_utilization}); "
            f"raise --tp or the utilisation"
        )
    return n
