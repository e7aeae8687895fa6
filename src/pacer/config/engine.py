"""The engine config: its parts (model, scheduler, cache, structured outputs), built from flat
vLLM-style keyword arguments with `EngineConfig.from_kwargs` (unknown keys are an error)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from pacer.config.cache import CacheConfig
from pacer.config.checks import DTYPES, choice, positive_int
from pacer.config.scheduler import SchedulerConfig

QUANTIZATIONS = ("auto", "none", "gguf", "int8")
# vLLM's --reasoning-parser names -> (start tag, end tag, whether output before the end tag is
# reasoning even without the start tag: DeepSeek-R1 may omit it, and Qwen3-Thinking templates
# open it in the prompt, so both say yes, as vLLM's current parsers do)
REASONING_PARSERS: dict[str, tuple[str, str, bool]] = {
    "qwen3": ("<think>", "</think>", True),
    "deepseek_r1": ("<think>", "</think>", True),
}

__all__ = ["ModelConfig", "StructuredOutputsConfig", "EngineConfig", "option_names", "REASONING_PARSERS"]


@dataclass(slots=True)
class ModelConfig:
    model: str | None = field(default=None, metadata={"help": "HF directory or .gguf file; default SmolLM2-135M-Instruct."})
    dtype: str = field(default="auto", metadata={"help": "float32 | bfloat16 | float16 | auto (float32 on CPU)."})
    device: str = field(default="cpu", metadata={"help": "cpu | cuda | cuda:N."})
    seed: int = field(default=0, metadata={"help": "Seed of the engine's sampler for unseeded requests."})
    num_threads: int | None = field(default=None, metadata={"help": "torch intra-op threads (CPU)."})
    attention_backend: str = field(
        default="auto",
        metadata={"help": "auto | cpp | torch: the C++ kernels (paged decode and prefill attention, fused "
                          "rope + KV write, silu_and_mul, add + RMSNorm; compiled on first use) or the torch "
                          "reference path."},
    )
    linear_backend: str = field(
        default="auto",
        metadata={"help": "auto | onednn | torch: projections through oneDNN with weights packed once "
                          "(auto on CPU when torch has it) or plain F.linear."},
    )
    quantization: str = field(
        default="auto",
        metadata={"help": "auto | none | gguf | int8: weights kept quantized (CPU, float32): a GGUF's "
                          "Q4_0/Q4_1/Q8_0 blocks as shipped, int8 weight-only from float weights, or none "
                          "(dequantized float32, the reference the quality checks compare against). auto: "
                          "gguf for a .gguf file on a CPU the packed kernels run with SIMD (AVX2, AVX-512 "
                          "VNNI), none otherwise."},
    )
    quant_activations: str = field(
        default="auto",
        metadata={"help": "auto | float | int8: activations of quantized linears, float (the float32 path's "
                          "results) or int8 per token and block of 32 (integer dot products over a tiled copy "
                          "of the blocks, as llama.cpp: faster at every batch size, KL ~3e-3 from float32). "
                          "auto: int8 where a SIMD kernel runs the packed weights, float otherwise."},
    )

    def validate(self) -> None:
        choice("dtype", self.dtype, ("auto", *DTYPES))
        if not (self.device == "cpu" or re.fullmatch(r"cuda(:\d+)?", self.device)):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.num_threads is not None:
            positive_int("num_threads", self.num_threads)
        choice("attention_backend", self.attention_backend, ("auto", "cpp", "torch"))
        choice("linear_backend", self.linear_backend, ("auto", "onednn", "torch"))
        choice("quantization", self.quantization, QUANTIZATIONS)
        choice("quant_activations", self.quant_activations, ("auto", "float", "int8"))


@dataclass(slots=True)
class StructuredOutputsConfig:
    structured_outputs_timeout: float = field(
        default=5.0,
        metadata={"help": "Seconds a grammar (JSON schema, regex, choice, Lark) may take to compile on the "
                          "grammar worker; past it that request alone fails with a 400 and the worker is killed."},
    )
    structured_outputs_workers: int = field(
        default=2, metadata={"help": "Grammar worker processes (compiles run in parallel, off the step loop)."}
    )
    reasoning_parser: str | None = field(
        default=None,
        metadata={"help": "qwen3 | deepseek_r1: the model thinks in <think>...</think> first (vLLM's flag): "
                          "grammars start after </think>, thinking_token_budget forces it, and chat "
                          "responses carry the thinking as reasoning_content."},
    )

    def validate(self) -> None:
        t = self.structured_outputs_timeout
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < float("inf"):
            raise ValueError(f"structured_outputs_timeout must be a number of seconds > 0, got {t!r}")
        positive_int("structured_outputs_workers", self.structured_outputs_workers)
        if self.reasoning_parser is not None:
            choice("reasoning_parser", self.reasoning_parser, tuple(REASONING_PARSERS))


_PARTS = (("model", ModelConfig), ("scheduler", SchedulerConfig), ("cache", CacheConfig),
          ("structured", StructuredOutputsConfig))


@dataclass(slots=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    structured: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """Build from flat vLLM-style keyword arguments; unknown names raise TypeError."""
        parts: dict[str, dict[str, Any]] = {part: {} for part, _ in _PARTS}
        owners = {f.name: part for part, klass in _PARTS for f in dataclasses.fields(klass)}
        for key, value in kwargs.items():
            if key not in owners:
                raise TypeError(f"unknown engine option {key!r}; known options: {', '.join(sorted(owners))}")
            parts[owners[key]][key] = value
        cfg = cls(ModelConfig(**parts["model"]), SchedulerConfig(**parts["scheduler"]), CacheConfig(**parts["cache"]),
                  StructuredOutputsConfig(**parts["structured"]))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        self.model.validate()
        self.scheduler.validate()
        self.cache.validate()
        self.structured.validate()


def option_names() -> list[str]:
    return [f.name for _, klass in _PARTS for f in dataclasses.fields(klass)]
