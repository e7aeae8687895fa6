"""From sampled tokens to what a caller sees: incremental detokenisation, stop strings, logprobs
and the `RequestOutput` the engine returns each step (the part vLLM V1 calls its output
processor). The engine owns finishing: a stop string found here is reported back to it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pacer.request import Request, RequestMetrics

__all__ = ["RequestOutput", "CompletionOutput", "TrackedRequest"]


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    """One sample of a prompt, as vLLM's `RequestOutput.outputs[i]`."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None
    logprobs: list[dict[int, float]] | None
    cumulative_logprob: float | None   # sum of the sampled tokens' logprobs (None without logprobs)
    metrics: RequestMetrics


@dataclass(slots=True)
class RequestOutput:
    """Incremental view of one request after a step (or its final state)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]          # all output tokens so far
    text: str                     # all output text so far
    new_token_ids: list[int]      # tokens added by this step
    new_text: str                 # text added by this step
    finished: bool
    finish_reason: str | None
    metrics: RequestMetrics
    num_cached_tokens: int
    priority: int
    tenant: str
    stop_reason: str | int | None = None
    prompt: str | None = None
    # None unless SamplingParams.logprobs is set: one {token_id: logprob} per output token, the
    # sampled token first, then the top-k most likely in descending order (raw model logprobs)
    logprobs: list[dict[int, float]] | None = None
    new_logprobs: list[dict[int, float]] | None = None   # those of new_token_ids
    # SamplingParams.n > 1 in LLM.generate: this output is sample 0, these are samples 1..n-1
    other_samples: list[RequestOutput] | None = None
    # finish_reason "error" because the request's constraint failed (structured_outputs: invalid,
    # unsupported, or its compile timed out): the message for the client (the server sends a 400)
    error: str | None = None

    @property
    def outputs(self) -> list[CompletionOutput]:
        """vLLM's view of the samples of this prompt: one per sample (n of them)."""
        samples = [self, *(self.other_samples or ())]
        return [CompletionOutput(i, o.text, list(o.token_ids), o.finish_reason, o.stop_reason, o.logprobs,
                                 None if o.logprobs is None else _cumulative(o.token_ids, o.logprobs), o.metrics)
                for i, o in enumerate(samples)]


def _cumulative(token_ids: list[int], logprobs: list[dict[int, float]]) -> float:
    return sum(lp[t] for t, lp in zip(token_ids, logprobs) if t in lp)


class TrackedRequest:
    """Output-side state of one request: its detokenizer, the text so far, stop strings, logprobs."""

    __slots__ = ("req", "detok", "text", "prompt", "max_stop_len", "logprobs", "error")

    def __init__(self, req: Request, detok: Any, prompt: str | None) -> None:
        self.req = req
        self.detok = detok
        self.text = ""
        self.prompt = prompt
        self.max_stop_len = max((len(s) for s in req.sampling_params.stop), default=0)
        self.logprobs: list[dict[int, float]] | None = None if req.sampling_params.logprobs is None else []
        self.error: str | None = None

    def push_tokens(self, num_new: int, logprobs: Sequence[Mapping[int, float]] | None
                    ) -> tuple[list[int], str, list[dict[int, float]] | None, str | None]:
        """Take the request's `num_new` newest output tokens. Returns their ids, the text they
        add, their logprobs (when asked for) and the stop string they completed, if any: then
        the text stops before that string, and the caller finishes the request with that stop
        reason."""
        req = self.req
        if num_new > 1 and self.detok is not None and req.sampling_params.stop and not req.is_finished:
            return self._push_each(num_new, logprobs)
        new_ids = req.output_token_ids[-num_new:] if num_new else []
        new_logprobs = None
        if self.logprobs is not None:
            new_logprobs = [] if logprobs is None else [dict(lp) for lp in logprobs[:num_new]]
            self.logprobs.extend(new_logprobs)
        if self.detok is None:
            return new_ids, "", new_logprobs, None
        new_text = self.detok.push(new_ids)
        hit = None
        if req.sampling_params.stop and not req.is_finished:
            new_text, hit = self._match_stop(new_text)
        if req.is_finished and hit is None and not isinstance(req.stop_reason, str):
            new_text += self.detok.flush()   # text held back for an incomplete character
        self.text += new_text
        return new_ids, new_text, new_logprobs, hit

    def _push_each(self, num_new: int, logprobs: Sequence[Mapping[int, float]] | None
                   ) -> tuple[list[int], str, list[dict[int, float]] | None, str | None]:
        """Several tokens of one step (accepted drafts) with stop strings: matched token by
        token, so a stop string ends the output at the token that completed it, as without
        speculation. Returns only the tokens kept (the caller drops the rest)."""
        req = self.req
        ids = req.output_token_ids[-num_new:]
        first_index = req.num_output_tokens - num_new
        before = len(self.text)
        kept, hit = num_new, None
        for i, tok in enumerate(ids):
            piece, hit = self._match_stop(self.detok.push([tok]), first_index + i + 1)
            self.text += piece
            if hit is not None:
                kept = i + 1
                break
        new_logprobs = None
        if self.logprobs is not None:
            new_logprobs = [] if logprobs is None else [dict(lp) for lp in logprobs[:kept]]
            self.logprobs.extend(new_logprobs)
        return ids[:kept], self.text[before:], new_logprobs, hit

    def _match_stop(self, new_text: str, num_output: int | None = None) -> tuple[str, str | None]:
        """The earliest stop string in the text's tail plus `new_text`: the part of `new_text`
        to keep (the text so far is cut when the string began in it) and the string found.
        `num_output`: the output tokens up to new_text's last (default: all of them)."""
        req = self.req
        n_out = req.num_output_tokens if num_output is None else num_output
        if n_out < req.sampling_params.min_tokens or not new_text:
            return new_text, None
        window_start = max(0, len(self.text) - self.max_stop_len)
        window = self.text[window_start:] + new_text
        hit = -1
        hit_stop = ""
        for s in req.sampling_params.stop:
            i = window.find(s)
            if i != -1 and (hit == -1 or i < hit):
                hit, hit_stop = i, s
        if hit == -1:
            return new_text, None
        keep = window_start + hit - len(self.text)   # may be negative: the stop began in old text
        if keep < 0:
            self.text = self.text[: len(self.text) + keep]
            keep = 0
        return new_text[:keep], hit_stop

    def output(self, new_ids: list[int], new_text: str,
               new_logprobs: list[dict[int, float]] | None = None) -> RequestOutput:
        r = self.req
        if self.logprobs is not None and new_logprobs is None:
            new_logprobs = []
        return RequestOutput(
            request_id=r.request_id, prompt_token_ids=r.prompt_token_ids, token_ids=list(r.output_token_ids),
            text=self.text, new_token_ids=list(new_ids), new_text=new_text, finished=r.is_finished,
            finish_reason=r.finish_reason.value if r.finish_reason else None, metrics=r.metrics,
            num_cached_tokens=r.num_cached_tokens, priority=r.priority, tenant=r.tenant,
            stop_reason=r.stop_reason, prompt=self.prompt,
            logprobs=None if self.logprobs is None else list(self.logprobs), new_logprobs=new_logprobs,
            error=self.error,
        )
