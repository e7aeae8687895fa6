"""OpenAI logprobs objects from the engine's per-token `{token_id: logprob}` dicts (the
sampled token first, then the top k in descending order; see `RequestOutput.logprobs`).

Completions use the legacy format (`tokens`, `token_logprobs`, `top_logprobs` with the
sampled token included, so k or k + 1 entries, and `text_offset`, the running length of the
token strings); chat uses `content: [{token, logprob, bytes, top_logprobs: [k entries]}]`.
A token's string is its own decode (special tokens spelled out), as in vLLM; `bytes` are
the token's exact bytes, which for a piece of a multi-byte character differ from its string's.
Logprobs are floored at -9999.0 as vLLM does, since JSON has no -inf.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["TokenText", "completion_logprobs", "chat_logprobs"]

_FLOOR = -9999.0


class TokenText:
    """Token id -> (string, bytes), cached per id (at most the vocabulary)."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        got = self._cache.get(token_id)
        if got is None:
            if self.tokenizer is None:   # a model without a tokenizer: vLLM's token-id spelling
                text, raw = f"token_id:{token_id}", f"token_id:{token_id}".encode()
            else:
                text = self.tokenizer.decode([token_id], skip_special_tokens=False)
                raw = self.tokenizer.token_bytes(token_id)
            got = self._cache[token_id] = (text, list(raw))
        return got


def _lp(value: float) -> float:
    return max(value, _FLOOR)


def completion_logprobs(token_ids: Sequence[int], entries: Sequence[dict[int, float]], texts: TokenText,
                        offset: int = 0) -> tuple[dict[str, Any], int]:
    """The legacy object for these tokens, and the text offset after them (for the next chunk)."""
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []
    for token_id, entry in zip(token_ids, entries):
        text = texts(token_id)[0]
        tokens.append(text)
        token_logprobs.append(_lp(entry[token_id]))
        top_logprobs.append({texts(t)[0]: _lp(lp) for t, lp in sorted(entry.items(), key=lambda kv: -kv[1])})
        text_offset.append(offset)
        offset += len(text)
    return ({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
             "text_offset": text_offset}, offset)


def _top_k(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    items = list(entry.items())
    if len(items) > k:    # the sampled token (first) is not among the top k
        return items[1:]
    return sorted(items, key=lambda kv: -kv[1])


def chat_logprobs(token_ids: Sequence[int], entries: Sequence[dict[int, float]], k: int,
                  texts: TokenText) -> dict[str, Any]:
    content = []
    for token_id, entry in zip(token_ids, entries):
        text, raw = texts(token_id)
        top = []
        for t, lp in _top_k(entry, k):
            t_text, t_raw = texts(t)
            top.append({"token": t_text, "logprob": _lp(lp), "bytes": t_raw})
        content.append({"token": text, "logprob": _lp(entry[token_id]), "bytes": raw, "top_logprobs": top})
    return {"content": content}
