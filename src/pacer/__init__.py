"""pacer: an LLM serving engine where batching is a scheduler policy."""

from pacer.config import EngineConfig
from pacer.request import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "EngineConfig", "Engine", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: importing pacer must not import torch
    if name == "LLM":
        from pacer.llm import LLM

        return LLM
    if name == "Engine":
        from pacer.engine import Engine

        return Engine
    raise AttributeError(f"module 'pacer' has no attribute {name!r}")
