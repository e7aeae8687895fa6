"""OpenAI response bodies from engine outputs: the whole body of a job that does not stream
(`completion_body`) and the SSE chunks of one that does (`Chunks`), with usage counted as
OpenAI counts it (each prompt once, every choice's completion tokens). Chat choices whose
tool calls are parsed go through one reader (pacer.server.tools.stream) either way, so a
streamed message reassembles to the non-streamed one.
"""

from __future__ import annotations

import json
from typing import Any

from pacer.engine import RequestOutput
from pacer.server.api.echo import echo_logprobs, prompt_text, vllm_prompt_logprobs
from pacer.server.api.logprobs import TokenText, chat_logprobs, completion_logprobs
from pacer.server.api.request_metrics import metrics_body
from pacer.server.job import Job
from pacer.server.reasoning import ReasoningReader
from pacer.server.tools.stream import ToolDeltaStream

__all__ = ["completion_body", "Chunks", "sse"]


def completion_body(job: Job, outs: list[RequestOutput], texts: TokenText) -> dict[str, Any]:
    """The JSON body of a finished job that did not stream; `outs` in choice order."""
    parsed = job.parsed
    k = parsed.sampling.get("logprobs")
    extra: dict[str, Any] = {}
    if parsed.endpoint == "chat":
        choices = []
        for i, o in enumerate(outs):
            message, finish = job.chat_message(o)
            choices.append({"index": i, "message": message, "finish_reason": finish, "stop_reason": o.stop_reason,
                            "logprobs": None if k is None else chat_logprobs(o.token_ids, o.logprobs or [], k, texts)})
        obj = "chat.completion"
        if outs and outs[0].prompt_logprobs is not None:   # vLLM's: one prompt, top level
            extra["prompt_logprobs"] = _prompt_logprobs(parsed, outs[0], texts)
    else:
        choices = [_completion_choice(parsed, i, o, texts) for i, o in enumerate(outs)]
        obj = "text_completion"
    if job.return_metrics:
        extra["metrics"] = _metrics(job, outs)
    return {"id": job.api_id, "object": obj, "created": job.created, "model": parsed.model,
            "choices": choices, "usage": _usage(outs, parsed.n, parsed.score_only), **extra}


def _metrics(job: Job, outs: list[RequestOutput]) -> list[dict[str, Any]]:
    """Per choice (in choice order), what the engine measured and the SLO it was held to."""
    return [{"index": i, **metrics_body(o.metrics, job.contexts[i].slo, o.finish_reason in ("stop", "length",
                                                                                              "tool_calls"))}
            for i, o in enumerate(outs)]


def _prompt_logprobs(parsed: Any, o: RequestOutput, texts: TokenText) -> Any:
    return vllm_prompt_logprobs(o.prompt_token_ids, o.prompt_logprobs, parsed.sampling.get("prompt_logprobs") or 0,
                                texts)


def _completion_choice(parsed: Any, i: int, o: RequestOutput, texts: TokenText) -> dict[str, Any]:
    """One completions choice; with `echo` the prompt leads its text and its logprobs; with
    `score_only` (max_tokens 0) the token computed is dropped."""
    k = parsed.sampling.get("logprobs")
    ids, entries, text = (list(o.token_ids), o.logprobs or [], o.text) if not parsed.score_only else ([], [], "")
    logprobs = None if k is None else completion_logprobs(ids, entries, texts)[0]
    if parsed.echo:
        text = prompt_text(o.prompt, o.prompt_token_ids, texts) + text
        if k is not None:
            logprobs = echo_logprobs(o.prompt_token_ids, o.prompt_logprobs or [], ids, entries, texts)
    return {"index": i, "text": text, "logprobs": logprobs,
            "finish_reason": o.finish_reason, "stop_reason": o.stop_reason,
            "prompt_logprobs": None if o.prompt_logprobs is None else _prompt_logprobs(parsed, o, texts)}




def _usage(outs: list[RequestOutput], n: int, score_only: bool = False) -> dict[str, Any]:
    """Outputs in choice order; a prompt counts once however many choices it has (as OpenAI)."""
    firsts = outs[::n]
    prompt = sum(len(o.prompt_token_ids) for o in firsts)
    completion = 0 if score_only else sum(len(o.token_ids) for o in outs)
    details = {"cached_tokens": sum(o.num_cached_tokens for o in firsts)}
    reused = sum(o.metrics.segment_reused_tokens for o in firsts)
    if reused:   # segment reuse (an extension): tokens filled from stored segments; their segments' tokens computed
        details["reused_tokens"] = reused
        details["recomputed_tokens"] = sum(o.metrics.segment_recomputed_tokens for o in firsts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": details}


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class Chunks:
    """SSE chunks of one streamed job, shaped like OpenAI's (chat: role first, finish_reason last),
    from the engine's deltas: each output's new text, tokens and logprobs (the engine holds text
    back while it could still start a stop string, so nothing sent is ever taken back)."""

    def __init__(self, job: Job, texts: TokenText) -> None:
        self.chat = job.parsed.endpoint == "chat"
        self.n = job.parsed.n
        self.k: int | None = job.parsed.sampling.get("logprobs")
        self.texts = texts
        self.text_offsets: dict[int, int] = {}   # completions' text_offset runs on across chunks
        self.base = {"id": job.api_id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": job.created, "model": job.parsed.model}
        self.extra = {"usage": None} if job.parsed.include_usage else {}
        self.tool_parser = job.tool_parser
        self.tool_streams: dict[int, ToolDeltaStream] = {}
        self.reasoning = job.reasoning
        self.readers: dict[int, ReasoningReader] = {}
        self.parsed = job.parsed
        self.echoed: set[int] = set()   # choices whose prompt (echo) has been sent
        self.prompt_sent: set[int] = set()   # choices whose prompt_logprobs have been sent

    def _prompt_logprobs_once(self, index: int, out: RequestOutput) -> Any:
        """vLLM's `prompt_logprobs` of the choice, the first time the engine's output has them
        (its last output repeats them for the whole answer): None after."""
        if out.prompt_logprobs is None or index in self.prompt_sent:
            return None
        self.prompt_sent.add(index)
        return _prompt_logprobs(self.parsed, out, self.texts)

    def _choice(self, choice: dict[str, Any]) -> str:
        return sse({**self.base, "choices": [choice], **self.extra})

    def opening(self, num_choices: int) -> list[str]:
        if not self.chat:
            return []
        return [self._choice({"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}) for i in range(num_choices)]

    def _new_logprobs(self, index: int, out: RequestOutput) -> dict[str, Any] | None:
        """The logprobs of the output's new tokens (sent as they come, with or without text)."""
        if self.k is None or not out.new_logprobs:
            return None
        ids, entries = out.new_token_ids, out.new_logprobs
        if self.chat:
            return chat_logprobs(ids, entries, self.k, self.texts)
        obj, self.text_offsets[index] = completion_logprobs(ids, entries, self.texts, self.text_offsets.get(index, 0))
        return obj

    def for_output(self, index: int, out: RequestOutput) -> list[str]:
        finish = {"finish_reason": out.finish_reason, "stop_reason": out.stop_reason} if out.finished else {
            "finish_reason": None}
        text = out.new_text
        logprobs = self._new_logprobs(index, out)
        if not self.chat:
            return self._completion_chunks(index, out, text, logprobs, finish)
        if self.tool_parser is not None or self.reasoning is not None:
            choices = self._parsed_choices(index, out, logprobs)
        else:
            choices = []
            if text or logprobs is not None:
                choices.append({"index": index, "delta": {"content": text}, "logprobs": logprobs,
                                "finish_reason": None})
            if out.finished:
                choices.append({"index": index, "delta": {}, "logprobs": None, **finish})
        prompt_logprobs = self._prompt_logprobs_once(index, out)
        if prompt_logprobs is None:
            return [self._choice(c) for c in choices]
        # vLLM's: the prompt's logprobs (top level) ride on the first chunk after they are computed
        lead = choices[0] if choices else {"index": index, "delta": {}, "logprobs": None, "finish_reason": None}
        first = sse({**self.base, "choices": [lead], "prompt_logprobs": prompt_logprobs, **self.extra})
        return [first, *(self._choice(c) for c in choices[1:])]

    def _completion_chunks(self, index: int, out: RequestOutput, text: str, logprobs: dict[str, Any] | None,
                           finish: dict[str, Any]) -> list[str]:
        """A completions chunk; the first one of an `echo` choice leads with the prompt (its
        text, and its tokens' logprobs, which arrive with the first output token)."""
        extra: dict[str, Any] = {}
        prompt_logprobs = self._prompt_logprobs_once(index, out)
        if prompt_logprobs is not None:
            extra["prompt_logprobs"] = prompt_logprobs
        if self.parsed.echo and index not in self.echoed and (self.k is None or out.prompt_logprobs is not None):
            self.echoed.add(index)
            text = prompt_text(out.prompt, out.prompt_token_ids, self.texts) + text
            if self.k is not None:
                ids, entries = out.new_token_ids, out.new_logprobs or []
                logprobs = echo_logprobs(out.prompt_token_ids, out.prompt_logprobs or [], ids, entries, self.texts)
                self.text_offsets[index] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        if not text and logprobs is None and not out.finished:
            return []
        return [self._choice({"index": index, "text": text, "logprobs": logprobs, **finish, **extra})]

    def _parsed_choices(self, index: int, out: RequestOutput, logprobs: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Deltas of a choice whose output is parsed: its thinking as `reasoning_content` (and
        `reasoning`) deltas, then its content, read for tool calls when it has tools: content,
        then each call's id and name, then its argument fragments (pacer.server.tools.stream)."""
        deltas: list[dict[str, Any]] = []
        text = out.new_text
        if self.reasoning is not None:
            reader = self.readers.get(index)
            if reader is None:
                reader = self.readers[index] = self.reasoning.reader(out.prompt_token_ids)
            segments = reader.feed(text, out.finished)
            deltas += [{"reasoning_content": t, "reasoning": t} for kind, t in segments if kind == "reasoning"]
            text = "".join(t for kind, t in segments if kind == "content")
        finish_reason = out.finish_reason
        if self.tool_parser is not None:
            stream = self.tool_streams.setdefault(index, ToolDeltaStream(self.tool_parser))
            deltas += stream.update(text, out.finished)
            finish_reason = stream.finish_reason(out.finish_reason)
        elif text:
            deltas.append({"content": text})
        choices: list[dict[str, Any]] = [{"index": index, "delta": d, "logprobs": None, "finish_reason": None}
                                         for d in deltas]
        if logprobs is not None:
            choices.append({"index": index, "delta": {}, "logprobs": logprobs, "finish_reason": None})
        if out.finished:
            finish = {"finish_reason": finish_reason, "stop_reason": out.stop_reason}
            choices.append({"index": index, "delta": {}, "logprobs": None, **finish})
        return choices

    def usage(self, outs: list[RequestOutput]) -> str:
        return sse({**self.base, "choices": [], "usage": _usage(outs, self.n, self.parsed.score_only)})

    def metrics(self, job: Job, outs: list[RequestOutput]) -> str:
        """The last chunk of a job that asked for per-request metrics: each choice's."""
        return sse({**self.base, "choices": [], "metrics": _metrics(job, outs)})
