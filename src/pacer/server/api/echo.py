"""The prompt in a response: `echo` on /v1/completions (the prompt's text before the output and,
with `logprobs`, its tokens in OpenAI's legacy logprobs format, the first token's null, as
lm-evaluation-harness reads them) and vLLM's `prompt_logprobs` field (per prompt token, null
first, else {token_id: {logprob, rank, decoded_token}}). Entries come from the engine's
`RequestOutput.prompt_logprobs` (the prompt token first, then the top k)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pacer.server.api.logprobs import TokenText, completion_logprobs

__all__ = ["prompt_text", "echo_logprobs", "vllm_prompt_logprobs"]

_FLOOR = -9999.0


def prompt_text(prompt: str | None, prompt_ids: Sequence[int], texts: TokenText) -> str:
    """The prompt as the client sent it (a token-id prompt: its decode)."""
    if prompt is not None:
        return prompt
    if texts.tokenizer is None:
        return ""
    return str(texts.tokenizer.decode(list(prompt_ids), skip_special_tokens=False))


def echo_logprobs(prompt_ids: Sequence[int], prompt_entries: Sequence[dict[int, float] | None],
                  out_ids: Sequence[int], out_entries: Sequence[dict[int, float]],
                  texts: TokenText) -> dict[str, Any]:
    """The legacy logprobs object of the prompt's tokens followed by the output's."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    offset = 0
    for token_id, entry in zip(prompt_ids, prompt_entries):
        text = texts(token_id)[0]
        tokens.append(text)
        text_offset.append(offset)
        offset += len(text)
        if entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(max(entry[token_id], _FLOOR))
        top_logprobs.append({texts(t)[0]: max(lp, _FLOOR) for t, lp in sorted(entry.items(), key=lambda kv: -kv[1])})
    rest, _ = completion_logprobs(out_ids, out_entries, texts, offset)
    return {"tokens": tokens + rest["tokens"], "token_logprobs": token_logprobs + rest["token_logprobs"],
            "top_logprobs": top_logprobs + rest["top_logprobs"], "text_offset": text_offset + rest["text_offset"]}


def vllm_prompt_logprobs(prompt_ids: Sequence[int], entries: Sequence[dict[int, float] | None] | None, k: int,
                         texts: TokenText) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token null (the first) or {token id: {logprob, rank,
    decoded_token}}; ranks are known for the top k (1 = most likely): a prompt token outside
    them gets a null rank."""
    if entries is None:
        return None
    out: list[dict[str, dict[str, Any]] | None] = []
    for token_id, entry in zip(prompt_ids, entries):
        if entry is None:
            out.append(None)
            continue
        top = [t for t in entry if t != token_id or len(entry) == k]   # k + 1 entries: the token is not in the top k
        ranks = {t: i + 1 for i, t in enumerate(sorted(top, key=lambda t: -entry[t]))}
        out.append({str(t): {"logprob": max(lp, _FLOOR), "rank": ranks.get(t), "decoded_token": texts(t)[0]}
                    for t, lp in entry.items()})
    return out
