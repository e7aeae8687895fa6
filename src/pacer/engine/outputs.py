"""From sampled tokens to what a caller sees: incremental detokenisation, stop strings, logprobs
and the `RequestOutput`s the engine returns each step (the part vLLM V1 calls its output
processor). The engine owns finishing: a stop string found here is reported back to it.

Outputs are deltas (vLLM's `RequestOutputKind.DELTA`): each carries only what its step added,
so an output's size does not grow with its stream's length; the finished output also carries
the whole output. Imports only `pacer.request`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pacer.request import Request, RequestMetrics

__all__ = ["RequestOutput", "CompletionOutput", "WholeOutput", "TrackedRequest"]


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


@dataclass(frozen=True, slots=True)
class WholeOutput:
    """All of a finished request's output: what its outputs' deltas add up to."""

    token_ids: list[int]
    text: str
    # None unless SamplingParams.logprobs is set: one {token_id: logprob} per output token, the
    # sampled token first, then the top-k most likely in descending order (raw model logprobs)
    logprobs: list[dict[int, float]] | None
    # None unless SamplingParams.prompt_logprobs is set: one entry per prompt token, the first None
    prompt_logprobs: list[dict[int, float] | None] | None = None


@dataclass(slots=True)
class RequestOutput:
    """What one step added to one request; when `finished`, also all of its output.

    Every output carries what is new since the request's previous one: `new_token_ids`,
    `new_logprobs` and `new_text`. Text waits while a stop string could still begin in it (the
    engine would cut it from the output), so `new_text` never has to be taken back. A request's
    deltas, concatenated, equal its finished output's `token_ids`, `logprobs` and `text`; those
    three are read on the finished output only (on another they raise ValueError)."""

    request_id: str
    prompt_token_ids: list[int]   # the request's own list, not a copy
    new_token_ids: list[int]      # tokens added by this step
    new_text: str                 # text settled by this step (see above)
    finished: bool
    finish_reason: str | None
    metrics: RequestMetrics       # the request's own record, updated as it runs
    num_cached_tokens: int
    priority: int
    tenant: str
    num_output_tokens: int = 0    # output tokens so far, this step's included
    stop_reason: str | int | None = None
    prompt: str | None = None
    new_logprobs: list[dict[int, float]] | None = None   # those of new_token_ids (None: not asked for)
    # SamplingParams.n > 1 in LLM.generate: this output is sample 0, these are samples 1..n-1
    other_samples: list[RequestOutput] | None = None
    # finish_reason "error" because the request's constraint failed (structured_outputs: invalid,
    # unsupported, or its compile timed out): the message for the client (the server sends a 400)
    error: str | None = None
    whole: WholeOutput | None = None   # set on the finished output only
    # SamplingParams.prompt_logprobs: one entry per prompt token (the first None, as vLLM), on the
    # request's first output with tokens and on its finished output; None otherwise
    prompt_logprobs: list[dict[int, float] | None] | None = None

    def _whole(self, name: str) -> WholeOutput:
        if self.whole is None:
            raise ValueError(f"RequestOutput.{name} is only on the finished output (request {self.request_id!r} "
                             f"is running): a step's output carries new_{name}")
        return self.whole

    @property
    def token_ids(self) -> list[int]:
        """All output token ids (the finished output only)."""
        return self._whole("token_ids").token_ids

    @property
    def text(self) -> str:
        """All output text (the finished output only)."""
        return self._whole("text").text

    @property
    def logprobs(self) -> list[dict[int, float]] | None:
        """All output tokens' logprobs, None unless asked for (the finished output only)."""
        return self._whole("logprobs").logprobs

    @property
    def outputs(self) -> list[CompletionOutput]:
        """vLLM's view of the samples of this prompt: one per sample (n of them); finished outputs only."""
        samples = [self, *(self.other_samples or ())]
        return [CompletionOutput(i, o.text, list(o.token_ids), o.finish_reason, o.stop_reason, o.logprobs,
                                 None if o.logprobs is None else _cumulative(o.token_ids, o.logprobs), o.metrics)
                for i, o in enumerate(samples)]


def _cumulative(token_ids: list[int], logprobs: list[dict[int, float]]) -> float:
    return sum(lp[t] for t, lp in zip(token_ids, logprobs) if t in lp)


class TrackedRequest:
    """Output-side state of one request: its detokenizer, the text so far (and how much of it the
    outputs have carried), stop strings, logprobs."""

    __slots__ = ("req", "detok", "text", "num_text_sent", "stop_searched", "prompt", "max_stop_len",
                 "logprobs", "error", "prompt_logprobs", "prompt_logprobs_sent", "stateless")

    def __init__(self, req: Request, detok: Any, prompt: str | None) -> None:
        self.req = req
        self.detok = detok
        self.text = ""
        self.num_text_sent = 0        # characters of `text` already in outputs' new_text
        self.stop_searched = False    # whether the stop strings have been looked for in `text` yet
        self.prompt = prompt
        self.max_stop_len = max((len(s) for s in req.sampling_params.stop), default=0)
        self.logprobs: list[dict[int, float]] | None = None if req.sampling_params.logprobs is None else []
        self.error: str | None = None
        self.prompt_logprobs: list[dict[int, float] | None] | None = (
            None if req.sampling_params.prompt_logprobs is None else [None] * req.num_prompt_tokens)
        self.prompt_logprobs_sent = False
        # no detokenizer, logprobs or prompt logprobs: a delta not built changes nothing here
        self.stateless = detok is None and self.logprobs is None and self.prompt_logprobs is None

    def put_prompt_logprobs(self, first_index: int, entries: Sequence[Mapping[int, float]]) -> None:
        """Record a step's prompt logprobs (prompt tokens first_index...; a recompute after
        preemption writes the same positions again)."""
        if self.prompt_logprobs is not None:
            self.prompt_logprobs[first_index:first_index + len(entries)] = [dict(e) for e in entries]

    def push_tokens(self, num_new: int, logprobs: Sequence[Mapping[int, float]] | None
                    ) -> tuple[list[int], str, list[dict[int, float]] | None, str | None]:
        """Take the request's `num_new` newest output tokens. Returns their ids, the text they
        settle (`_settle`), their logprobs (when asked for) and the stop string they completed,
        if any: then the text stops before that string, and the caller finishes the request with
        that stop reason."""
        req = self.req
        if num_new > 1 and self.detok is not None and req.sampling_params.stop and not req.is_finished:
            return self._push_each(num_new, logprobs)
        new_ids = req.output_token_ids[-num_new:] if num_new else []
        new_logprobs = self._take_logprobs(logprobs, num_new)
        if self.detok is None:
            return new_ids, "", new_logprobs, None
        new_text = self.detok.push(new_ids)
        hit = None
        if req.sampling_params.stop and not req.is_finished:
            new_text, hit = self._match_stop(new_text)
        if req.is_finished and hit is None and not isinstance(req.stop_reason, str):
            new_text += self.detok.flush()   # text held back for an incomplete character
        self.text += new_text
        return new_ids, self._settle(final=req.is_finished or hit is not None), new_logprobs, hit

    def _push_each(self, num_new: int, logprobs: Sequence[Mapping[int, float]] | None
                   ) -> tuple[list[int], str, list[dict[int, float]] | None, str | None]:
        """Several tokens of one step (accepted drafts) with stop strings: matched token by
        token, so a stop string ends the output at the token that completed it, as without
        speculation. Returns only the tokens kept (the caller drops the rest)."""
        req = self.req
        ids = req.output_token_ids[-num_new:]
        first_index = req.num_output_tokens - num_new
        kept, hit = num_new, None
        for i, tok in enumerate(ids):
            piece, hit = self._match_stop(self.detok.push([tok]), first_index + i + 1)
            self.text += piece
            if hit is not None:
                kept = i + 1
                break
        return ids[:kept], self._settle(final=hit is not None), self._take_logprobs(logprobs, kept), hit

    def _take_logprobs(self, logprobs: Sequence[Mapping[int, float]] | None,
                       num_kept: int) -> list[dict[int, float]] | None:
        """The logprobs of the step's first `num_kept` tokens, kept for the whole output too."""
        if self.logprobs is None:
            return None
        new_logprobs = [] if logprobs is None else [dict(lp) for lp in logprobs[:num_kept]]
        self.logprobs.extend(new_logprobs)
        return new_logprobs

    def _settle(self, final: bool) -> str:
        """The text not yet sent that no later token can change. A stop string found later cuts
        the text where it began, so while the request runs the tail that could be such a
        string's beginning waits: its length less one once the stop strings have been looked
        for, its whole length before (a string may then lie wholly in text already there, as
        before `min_tokens`). `final`: the text is complete."""
        hold = 0
        if not final and self.max_stop_len:
            hold = self.max_stop_len - 1 if self.stop_searched else self.max_stop_len
        end = max(self.num_text_sent, len(self.text) - hold)
        piece = self.text[self.num_text_sent:end]
        self.num_text_sent = end
        return piece

    def _match_stop(self, new_text: str, num_output: int | None = None) -> tuple[str, str | None]:
        """The earliest stop string in the text's tail plus `new_text`: the part of `new_text`
        to keep (the text so far is cut when the string began in it; never before the text sent,
        see `_settle`) and the string found. `num_output`: the output tokens up to new_text's
        last (default: all of them)."""
        req = self.req
        n_out = req.num_output_tokens if num_output is None else num_output
        if n_out < req.sampling_params.min_tokens or not new_text:
            return new_text, None
        self.stop_searched = True
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

    def delta(self, new_ids: list[int], new_text: str,
              new_logprobs: list[dict[int, float]] | None = None) -> RequestOutput:
        """The output of a step of a running request: only what the step added."""
        return self._output(new_ids, new_text, new_logprobs, None)

    def finish(self, new_ids: list[int], new_text: str,
               new_logprobs: list[dict[int, float]] | None = None) -> RequestOutput:
        """The finished request's last output: the step's delta, the text still held back, and
        the whole output."""
        new_text += self._settle(final=True)
        whole = WholeOutput(list(self.req.output_token_ids), self.text, self.logprobs, self.prompt_logprobs)
        return self._output(new_ids, new_text, new_logprobs, whole)

    def _output(self, new_ids: list[int], new_text: str, new_logprobs: list[dict[int, float]] | None,
                whole: WholeOutput | None) -> RequestOutput:
        r = self.req
        if self.logprobs is not None and new_logprobs is None:
            new_logprobs = []
        prompt_logprobs = None
        if self.prompt_logprobs is not None and (whole is not None or (new_ids and not self.prompt_logprobs_sent)):
            prompt_logprobs, self.prompt_logprobs_sent = self.prompt_logprobs, True
        return RequestOutput(
            request_id=r.request_id, prompt_token_ids=r.prompt_token_ids, new_token_ids=list(new_ids),
            new_text=new_text, finished=r.is_finished,
            finish_reason=r.finish_reason.value if r.finish_reason else None, metrics=r.metrics,
            num_cached_tokens=r.num_cached_tokens, priority=r.priority, tenant=r.tenant,
            num_output_tokens=r.num_output_tokens, stop_reason=r.stop_reason, prompt=self.prompt,
            new_logprobs=new_logprobs, error=self.error, whole=whole, prompt_logprobs=prompt_logprobs,
        )
