"""`Engine.prewarm`: system prompts and tool definitions computed into the prefix cache at
start-up, pinned, and public to every tenant when asked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pacer.request import SamplingParams

if TYPE_CHECKING:
    from pacer.engine import Engine

__all__ = ["prewarm"]


def prewarm(engine: Engine, prompts: Sequence[str | Sequence[int]], *, public: bool = True,
            tenant: str = "default", pin: bool = True) -> list[int]:
    """Compute `prompts` (e.g. system prompts, tool definitions) into the prefix cache now,
    pinned (never evicted until `kv.unpin`) and, when `public`, visible to every tenant
    even under tenant isolation. Steps the engine until they finish: call it at start-up,
    from the thread that steps the engine. Returns the cached tokens of each prompt."""
    if not engine.kv.prefix_caching:
        raise ValueError("prewarm needs enable_prefix_caching=True")
    ids = []
    for prompt in prompts:
        rid = engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0), tenant=tenant)
        engine.kv.mark_prewarm(rid, public=public, pin=pin)
        ids.append(rid)
    wanted = set(ids)
    while wanted:
        if not engine.has_unfinished_requests():
            raise RuntimeError(f"engine stopped with prewarm requests unfinished: {sorted(wanted)[:5]}")
        wanted -= {o.request_id for o in engine.step() if o.finished}
    bs = engine.kv.block_size
    return [len(engine.tokenize_prompt(p)) // bs * bs for p in prompts]
