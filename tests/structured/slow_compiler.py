"""An injected grammar compiler for tests: a schema titled "slow" spins the worker's core
forever (a pathological compile); anything else compiles normally."""

from typing import Any

from pacer.structured.grammar import compile_spec as real_compile_spec


def compile_spec(spec: dict[str, Any], tokenizer: Any) -> str:
    value = spec.get("value")
    if isinstance(value, dict) and value.get("title") == "slow":
        n = 0
        while True:   # burns CPU until the worker is killed
            n += 1
    return real_compile_spec(spec, tokenizer)
