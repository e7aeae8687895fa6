"""Offline API: `LLM(model=None, **engine_kwargs).generate(...)` / `.chat(...)`, as in vLLM."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pacer.config import EngineConfig
from pacer.config.slo import Slo
from pacer.engine import Engine, RequestOutput
from pacer.engine.segment_spans import render_chats, segments_per_prompt
from pacer.errors import FieldTypeError
from pacer.request import SamplingParams

__all__ = ["LLM"]

Prompt = str | Sequence[int]
Message = dict[str, str]


def _per_prompt(name: str, value: Any, n: int, default: Any) -> list[Any]:
    if value is None:
        return [default] * n
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise ValueError(f"{name}: got {len(value)} values for {n} prompts")
        return list(value)
    return [value] * n


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list | tuple) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


class LLM:
    """Generate with an in-process engine. Engine options use vLLM's names
    (max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, block_size, max_model_len,
    scheduling_policy, dtype, device, num_kv_blocks or kv_cache_memory, ...)."""

    def __init__(self, model: str | None = None, **engine_kwargs: Any) -> None:
        self.config = EngineConfig.from_kwargs(model=model, **engine_kwargs)
        self.engine = Engine.from_config(self.config)

    def close(self) -> None:
        """Graceful shutdown (with kv_offloading_dir: the cached KV is written to disk)."""
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 priority: int | Sequence[int] | None = None,
                 tenant: str | Sequence[str] | None = None,
                 slo: Slo | Mapping[str, Any] | Sequence[Slo | Mapping[str, Any] | None] | None = None,
                 request_class: str | Sequence[str | None] | None = None,
                 session: str | Sequence[str | None] | None = None, segments: Sequence[Any] | None = None,
                 kv_retention: Mapping[str, Any] | None = None,
                 segment_reuse: str | Sequence[str | None] | None = None) -> list[RequestOutput]:
        """Run prompts (strings or token-id lists) to completion; outputs in input order. With
        `SamplingParams.n > 1` a prompt's output is its sample 0, and `.outputs` lists all n
        (vLLM's shape); each sample is its own engine request (`SamplingParams.for_sample`).
        `slo`: the requests' own targets (a `Slo` or {"ttft_ms": .., "itl_ms": ..}; one for all
        or one per prompt; default `SamplingParams.slo`), on top of their class's from the
        engine's `slo` config; `request_class` names the class (default: classified by lengths).
        `segments`: per prompt, token spans [(start, length)] reusable elsewhere (segment reuse);
        `segment_reuse` "off" (for all or per prompt) opts out of it (no reuse, no store)."""
        prompt_list = self._as_prompt_list(prompts)
        n = len(prompt_list)
        params = _per_prompt("sampling_params", sampling_params, n, SamplingParams())
        prios = _per_prompt("priority", priority, n, 0)
        tenants = _per_prompt("tenant", tenant, n, "default")
        slos = _per_prompt("slo", slo, n, None)
        classes = _per_prompt("request_class", request_class, n, None)
        sessions, spans = _per_prompt("session", session, n, None), segments_per_prompt(segments, n)
        reuses = iter(_per_prompt("segment_reuse", segment_reuse, n, None))
        prepared = []
        for p, sp, pr, te, so, rc, sg in zip(prompt_list, params, prios, tenants, slos, classes, spans):   # all first
            if not isinstance(sp, SamplingParams):
                raise FieldTypeError("sampling_params", f"sampling_params must be SamplingParams, got {type(sp).__name__}")
            one = sp if sp.n == 1 else sp.for_sample(0)
            prepared.append((self.engine.prepare(p, one, priority=pr, tenant=te, request_class=rc, slo=so,
                                                 segments=sg, segment_reuse=next(reuses)), sp))
        groups = [[self.engine.add_request(dataclasses.replace(prep, params=sp.for_sample(j)), session=ses,
                                           kv_retention=kv_retention) for j in range(sp.n)]
                  for (prep, sp), ses in zip(prepared, sessions)]
        ids = [rid for g in groups for rid in g]
        finals = dict(zip(ids, self._collect(ids)))
        outs = []
        for g in groups:
            first = finals[g[0]]
            if len(g) > 1:
                first.other_samples = [finals[rid] for rid in g[1:]]
            outs.append(first)
        return outs

    def chat(self, messages: Sequence[Message] | Sequence[Sequence[Message]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
             priority: int | Sequence[int] | None = None,
             tenant: str | Sequence[str] | None = None,
             slo: Slo | Mapping[str, Any] | Sequence[Slo | Mapping[str, Any] | None] | None = None,
             request_class: str | Sequence[str | None] | None = None,
             session: str | Sequence[str | None] | None = None, segment_roles: Sequence[str] | None = None,
             kv_retention: Mapping[str, Any] | None = None, chat_template: str | None = None,
             chat_template_kwargs: Mapping[str, Any] | None = None,
             segment_reuse: str | Sequence[str | None] | None = None) -> list[RequestOutput]:
        """Apply the model's chat template (or `chat_template`, a template's text) to one
        conversation or a list of them, with `chat_template_kwargs` as its extra variables (vLLM's:
        e.g. {"enable_thinking": False}). `session` names each conversation's agent session: its KV
        is retained while the caller's tool runs (an eviction tier, `pacer.kv.retention`);
        `kv_retention` {"ttl_s": s} or {"release": True}; `segment_roles`: segments' roles (default tool;
        a message's own `"segment": True / False` decides for it); `segment_reuse`: as in `generate`."""
        if self.engine.tokenizer is None:
            raise ValueError("chat: this model has no tokenizer / chat template")
        convs: list[Sequence[Message]]
        if messages and isinstance(messages[0], dict):
            convs = [messages]  # type: ignore[list-item]
        else:
            convs = list(messages)  # type: ignore[arg-type]
        kwargs = dict(chat_template_kwargs or {})
        marks = self.config.cache.segment_reuse == "approximate" and segment_reuse != "off"
        roles = None if not marks else ("tool",) if segment_roles is None else tuple(segment_roles)
        prompts, spans = render_chats(self.engine.tokenizer, convs, roles, chat_template, kwargs)
        return self.generate(prompts, sampling_params, priority=priority, tenant=tenant, slo=slo,
                             request_class=request_class, session=session, kv_retention=kv_retention,
                             segments=spans, segment_reuse=segment_reuse)

    def prewarm(self, prompts: Prompt | Sequence[Prompt] | Sequence[Sequence[Message]], *, public: bool = True,
                tenant: str = "default", pin: bool = True) -> list[int]:
        """Compute prefixes now (system prompts, tool definitions, few-shot examples) and pin
        them in the prefix cache, so the first user already hits them. Each prompt is text,
        token ids, or a list of chat messages (rendered without a generation prompt, so a
        system message prewarms the start of every conversation that begins with it).
        `public=True` shares them with every tenant even under tenant isolation. Returns the
        number of cached tokens per prompt (whole blocks)."""
        items: list[Prompt] = []
        for p in ([prompts] if isinstance(prompts, str) or _is_token_ids(prompts) else list(prompts)):
            if isinstance(p, list | tuple) and p and isinstance(p[0], dict):
                if self.engine.tokenizer is None:
                    raise ValueError("prewarm: chat messages need a tokenizer with a chat template")
                items.append(self.engine.tokenizer.apply_chat_template(list(p), add_generation_prompt=False))
            else:
                items.append(p)  # type: ignore[arg-type]
        from pacer.engine.prewarm import prewarm

        return prewarm(self.engine, items, public=public, tenant=tenant, pin=pin)

    @staticmethod
    def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        if isinstance(prompts, str):
            return [prompts]
        seq: list[Any] = list(prompts)
        if seq and all(isinstance(t, int) and not isinstance(t, bool) for t in seq):
            return [seq]  # one prompt given as token ids
        if not seq:
            raise ValueError("prompts must not be empty")
        return seq

    def _collect(self, ids: list[str]) -> list[RequestOutput]:
        wanted = set(ids)
        finals: dict[str, RequestOutput] = {}
        while len(finals) < len(wanted):
            if not self.engine.has_unfinished_requests():
                missing = wanted - set(finals)
                raise RuntimeError(f"engine stopped with requests unfinished: {sorted(missing)[:5]}")
            for out in self.engine.step():
                if out.finished and out.request_id in wanted:
                    finals[out.request_id] = out
        return [finals[i] for i in ids]
