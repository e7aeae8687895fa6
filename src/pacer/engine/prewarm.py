"""Prewarming: compute prompts (system prompts, tool definitions) into the prefix cache at
start-up, pinned and, when public, visible to every tenant. A procedure on the engine's public
API (`add_request`, `step`, the KV manager's `mark_prewarm`), run from the thread that steps it."""

from __future__ import annotations

from collections.abc import Sequence

from pacer.engine.engine import Engine
from pacer.request import SamplingParams

__all__ = ["prewarm"]


def prewarm(engine: Engine, prompts: Sequence[str | Sequence[int]], *, public: bool = True,
            tenant: str = "default", pin: bool = True) -> list[int]:
    """Compute `prompts` into the prefix cache now, pinned (never evicted until `kv.unpin`) and,
    when `public`, visible to every tenant even under tenant isolation. Steps the engine until
    they finish. Returns the cached tokens of each prompt."""
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
