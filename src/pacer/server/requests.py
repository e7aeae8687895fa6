"""From a parsed OpenAI request to the engine requests it makes: one per prompt and choice.

First the prompt's tokens (`prompt_ids`: the chat template and the tokenizer, the costly
part, safe on any thread: the service runs it off the event loop and after the key's charge
for its places), then per prompt its sampling params, its class (`x-pacer-class` only as the
key allows it, see pacer.server.access.auth), its own SLO targets bounded as the key allows
them, and the engine's one prepare (fit, class targets). Every refusal is a 400 naming the
field; a prompt that can never fit is also reported to `on_refused` (metrics, admission).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pacer.config.slo import ClassRules, Slo
from pacer.engine import Engine, RequestOutput
from pacer.engine.prepare import PreparedRequest, check_session
from pacer.errors import FieldError
from pacer.request import ContextLengthError, SamplingParams
from pacer.server.access.auth import APIKey, bound_slo
from pacer.server.api.errors import APIError, bad_request
from pacer.server.api.protocol import ParsedRequest
from pacer.server.tools.template import render_chat, render_chat_segments, template_error

__all__ = ["RequestContext", "Spec", "RequestBuilder", "num_engine_requests"]


class PromptIds(list[int]):
    """A chat prompt's token ids and its segments (the tool messages' contents and those of the
    messages marked `"segment": true`, as token spans, when the engine reuses segments and the
    request does not opt out: `pacer.sched.segments`)."""

    segments: list[tuple[int, int]] = []


@dataclass(slots=True)
class RequestContext:
    """Server-side facts about one engine request, for metrics and the request log."""

    api_id: str
    index: int
    endpoint: str
    model: str
    stream: bool
    tenant: str
    request_class: str
    priority: int
    max_tokens: int
    slo: Slo = Slo()           # the targets it is held to (class's with its own on top)
    api_key_name: str | None = None   # the key's name (never the key), for limits and the log
    status: int = 200          # what the client got: 200, 408 (read too slowly), 429 (displaced), 499 (went away), 500
    started: bool = False
    # a session's chat turn with tools: whether its finished output called one (a turn that
    # answered instead closes the session's retention window; pacer.kv.retention)
    session: str | None = None
    called_tool: Callable[[RequestOutput], bool] | None = None


@dataclass(frozen=True, slots=True)
class Spec:
    """One engine request of a job: its id, what the engine queues, and the server's facts."""

    request_id: str
    prepared: PreparedRequest
    context: RequestContext


class RequestBuilder:
    def __init__(self, engine: Engine, class_rules: ClassRules, chat_template: str | None,
                 on_refused: Callable[[str, str], None], floor_trusted_slo: bool = True,
                 chat_template_kwargs: dict[str, Any] | None = None) -> None:
        self.engine = engine
        self.chat_template_kwargs = dict(chat_template_kwargs or {})   # --default-chat-template-kwargs
        self.class_rules = class_rules
        self.chat_template = chat_template
        self.on_refused = on_refused             # (reason, tenant): a request that can never run
        self.floor_trusted_slo = floor_trusted_slo

    def prompt_ids(self, parsed: ParsedRequest) -> list[list[int]]:
        """Token ids of each prompt (chat: the messages rendered with the template). Any thread."""
        try:
            if parsed.messages is not None:
                tok = self.engine.tokenizer
                if tok is None:
                    raise bad_request("messages", "this model has no tokenizer / chat template")
                tools = parsed.tools.tools if parsed.tools is not None else None
                kwargs = {**self.chat_template_kwargs, **(parsed.chat_template_kwargs or {})}
                if self.engine.config.cache.segment_reuse == "approximate" and parsed.segment_reuse != "off":
                    ids, spans = render_chat_segments(tok, parsed.messages, tools, self.chat_template, kwargs)
                    prompt = PromptIds(ids)
                    prompt.segments = spans
                    return [prompt]
                return [render_chat(tok, parsed.messages, tools, self.chat_template, kwargs)]
            return [self.engine.tokenize_prompt(p) for p in parsed.prompts]
        except APIError:
            raise
        except FieldError as e:
            raise bad_request(e.field, str(e), e.code) from None
        except (ValueError, TypeError) as e:
            raise bad_request("messages" if parsed.messages is not None else "prompt", str(e)) from None
        except Exception as e:   # template errors (jinja) and the like are the client's input
            raise template_error(e) from None

    def specs(self, api_id: str, model_name: str, parsed: ParsedRequest, prompts: list[list[int]], *,
              is_agent: bool, declared_class: str | None, header_slo: Slo | None, key: APIKey | None) -> list[Spec]:
        """The engine requests of a job: prompt p's choice j is request `{api_id}-{p * n + j}`."""
        specs: list[Spec] = []
        for p, ids in enumerate(prompts):
            params = self._params(parsed, len(ids))
            try:
                rclass = self.class_rules.classify(len(ids), parsed.max_tokens, is_agent or parsed.has_tools,
                                                   declared_class)
            except ValueError as e:
                raise bad_request("x-pacer-class", str(e)) from None
            own = bound_slo(key, (header_slo or Slo()).merged(parsed.slo), self.engine.slo_set.for_class(rclass),
                            self.floor_trusted_slo)
            prepared = self._prepare(parsed, ids, params, rclass, own, key)
            for j in range(parsed.n):
                i = p * parsed.n + j
                ctx = RequestContext(api_id, i, parsed.endpoint, model_name, parsed.stream, parsed.tenant,
                                     rclass, parsed.priority, params.max_tokens, prepared.slo,
                                     key.name if key else None)
                specs.append(Spec(f"{api_id}-{i}", dataclasses.replace(prepared, params=prepared.params.for_sample(j)), ctx))
        return specs

    def _params(self, parsed: ParsedRequest, num_prompt_tokens: int) -> SamplingParams:
        """The request's sampling params; chat without max_tokens gets the room the context leaves."""
        max_tokens = parsed.max_tokens
        if max_tokens is None:   # chat: whatever room the context leaves (at least 1, or the fit refuses)
            max_tokens = 16 if parsed.endpoint == "completions" else max(
                1, self.engine.max_context_tokens - num_prompt_tokens)
        try:
            return SamplingParams(max_tokens=max_tokens, **parsed.sampling)
        except FieldError as e:
            raise bad_request(e.field, str(e), e.code) from None

    def _prepare(self, parsed: ParsedRequest, ids: list[int], params: SamplingParams, request_class: str,
                 own_slo: Slo, key: APIKey | None = None) -> PreparedRequest:
        """The engine's one prepare of a prompt (fit, class targets with the request's own on top);
        a prompt that can never fit is reported as refused. A bound key's `max_kv_retention_s`
        bounds the session's `kv_retention.ttl_s` hint below the server's maximum."""
        try:
            prepared = self.engine.prepare(ids, params.for_sample(0), priority=parsed.priority, tenant=parsed.tenant,
                                           request_class=request_class, slo=own_slo, cache_salt=parsed.cache_salt,
                                           field="messages" if parsed.endpoint == "chat" else "prompt",
                                           segments=getattr(ids, "segments", None),
                                           segment_reuse=parsed.segment_reuse)
            if parsed.session is None and parsed.kv_retention is None:
                return prepared
            max_ttl = self.engine.retention_max_ttl
            if key is not None and key.max_kv_retention_s is not None:
                max_ttl = min(max_ttl, key.max_kv_retention_s)
            ttl, release = check_session(parsed.session, parsed.kv_retention, max_ttl)
            return dataclasses.replace(prepared, session=parsed.session, retention_ttl=ttl, retention_release=release)
        except ContextLengthError as e:
            self.on_refused(e.code, parsed.tenant)
            raise bad_request(e.field, str(e), e.code) from None
        except FieldError as e:
            raise bad_request(e.field, str(e), e.code) from None


def num_engine_requests(parsed: ParsedRequest) -> int:
    """How many engine requests the job makes: its prompts times `n` (chat: one prompt)."""
    return (len(parsed.prompts) if parsed.messages is None else 1) * parsed.n

