"""OpenAI request parsing: JSON body -> `ParsedRequest`, every error naming its field.

Fields follow the OpenAI API, `logprobs` (completions: an int k; chat: `logprobs` plus
`top_logprobs`), `presence_penalty`, `frequency_penalty` and `n` (1..MAX_N) included, and
vLLM's extensions `top_k`, `min_tokens`, `ignore_eos`, `stop_token_ids`, `repetition_penalty`,
`priority`; `tenant` is a pacer extension, also read from `user` (with an API key `user` is an
end-user id and the tenant comes from the key: pacer.server.access.auth). Options we do not implement
(`suffix`, `best_of` > 1) are refused with a 400 naming the field rather
than ignored. `echo` (completions) returns the prompt before the output, with `logprobs` its
tokens' logprobs too (the first token's null), and allows `max_tokens: 0` (score the prompt,
generate nothing: one token is computed and dropped); vLLM's `prompt_logprobs` (both endpoints)
returns vLLM's per-prompt-token entries. Unknown keys are ignored, as
OpenAI-compatible servers commonly do. Structured outputs (`response_format`,
`structured_outputs`, `guided_*`) are read by pacer.server.api.structured, `tools` /
`tool_choice` by pacer.server.tools.api; a chat request with tools is also of class `agent`.
Segment reuse's extensions: `segment_reuse` ("off" | "approximate", checked against the server's
mode by the engine's prepare) and a chat message's `segment` (true: its content is a segment;
false: a tool message's is not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pacer.config.slo import Slo, slo_from_request
from pacer.request import MAX_LOGPROBS
from pacer.server.api.errors import bad_request
from pacer.server.api.structured import parse_structured
from pacer.server.tools.api import ToolRequest, parse_tool_calls, parse_tools
from pacer.server.tools.template import RESERVED_TEMPLATE_KWARGS

__all__ = ["ParsedRequest", "parse_completion", "parse_chat", "MAX_N"]

_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 8   # most choices per prompt (`n`): each is its own engine request


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: str                                   # "completions" | "chat"
    model: str
    prompts: list[str | list[int]]                  # completions: one entry per prompt (n choices each)
    messages: list[dict[str, Any]] | None           # chat: role/content (+ tool_calls, tool_call_id)
    max_tokens: int | None                          # as requested; None: server default
    sampling: dict[str, Any] = field(default_factory=dict)   # SamplingParams kwargs but max_tokens
    n: int = 1                                      # choices per prompt
    stream: bool = False
    include_usage: bool = False
    priority: int = 0
    tenant: str = "default"
    has_tools: bool = False
    cache_salt: str | None = None                   # vLLM's: share cached blocks only with the same salt
    tenant_given: bool = False                      # `tenant` or `user` was in the body
    tools: ToolRequest | None = None                # chat: tools, tool_choice, parallel_tool_calls
    structured_param: str | None = None             # the field that constrained the output, if any
    slo: Slo = Slo()                                # the request's own targets (body `slo`)
    echo: bool = False                              # completions: the prompt before the output
    score_only: bool = False                        # echo with max_tokens 0: drop the one token computed
    return_metrics: bool = False                    # the body asks for per-request metrics in the response
    session: str | None = None                      # agent session (body `session` or x-session-id header)
    kv_retention: dict[str, Any] | None = None      # its hint: {"ttl_s": 30} | {"release": true}
    chat_template_kwargs: dict[str, Any] | None = None   # chat: the template's extra variables (vLLM's)
    segment_reuse: Any = None                       # the request's own (checked by `check_segment_reuse`)


def parse_completion(body: Any) -> ParsedRequest:
    body = _object(body)
    common = _common(body)
    echo = bool(_opt_bool(body, "echo"))
    _refuse_if(body, "suffix", lambda v: v not in (None, ""), "suffix is not supported")
    _refuse_if(body, "best_of", lambda v: v not in (None, 1),
               "best_of other than 1 is not supported: ask for n choices and pick among them")
    logprobs = _opt_int(body, "logprobs", low=0, high=MAX_LOGPROBS)
    if logprobs is not None:
        common["sampling"]["logprobs"] = logprobs
        if echo:   # the prompt's tokens get the same k (vLLM's echo)
            common["sampling"]["prompt_logprobs"] = max(logprobs, common["sampling"].get("prompt_logprobs") or 0)
    _add_structured(body, common)
    max_tokens = _opt_int(body, "max_tokens", low=0 if echo else 1)
    if max_tokens == 0 and common["stream"]:
        raise bad_request("max_tokens", "max_tokens 0 (score the prompt only) is not supported with stream")
    return ParsedRequest(endpoint="completions", prompts=_prompts(body.get("prompt", ...)), messages=None,
                         max_tokens=1 if max_tokens == 0 else max_tokens, echo=echo, score_only=max_tokens == 0,
                         **common)


def parse_chat(body: Any) -> ParsedRequest:
    body = _object(body)
    common = _common(body)
    top_logprobs = _opt_int(body, "top_logprobs", low=0, high=MAX_LOGPROBS)
    if _opt_bool(body, "logprobs"):
        common["sampling"]["logprobs"] = top_logprobs or 0
    elif top_logprobs:
        raise bad_request("top_logprobs", "top_logprobs needs logprobs to be true")
    _add_structured(body, common)
    max_tokens = _opt_int(body, "max_completion_tokens", low=1)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", low=1)
    tools = parse_tools(body)
    if tools is not None and tools.forced and "structured_outputs" in common["sampling"]:
        raise bad_request("tool_choice", f"tool_choice {tools.choice!r} forces a tool call and cannot be combined "
                                         f"with {common['structured_param']}")
    common["has_tools"] = tools is not None
    common["tools"] = tools
    return ParsedRequest(endpoint="chat", prompts=[], messages=_messages(body.get("messages", ...)),
                         max_tokens=max_tokens, chat_template_kwargs=_template_kwargs(body), **common)


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    """vLLM's `chat_template_kwargs`: an object of the template's extra variables (not its own arguments)."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise bad_request("chat_template_kwargs", 'chat_template_kwargs must be an object such as '
                                                  '{"enable_thinking": false}')
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise bad_request("chat_template_kwargs", f"chat_template_kwargs may not set {', '.join(reserved)} "
                                                  "(the request's own fields set them)")
    return kwargs


def _add_structured(body: dict[str, Any], common: dict[str, Any]) -> None:
    structured, param = parse_structured(body)
    if structured is not None:
        common["sampling"]["structured_outputs"] = structured
        common["structured_param"] = param


def _common(body: dict[str, Any]) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model", "model is required and must be a non-empty string")
    n = _opt_int(body, "n", low=1, high=MAX_N)
    stream = _opt_bool(body, "stream") or False
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad_request("stream_options", "stream_options must be an object")
        if not stream:
            raise bad_request("stream_options", "stream_options is only allowed when stream is true")
        include_usage = bool(_opt_bool(opts, "include_usage", "stream_options.include_usage"))
    priority = _opt_int(body, "priority", low=None)
    try:
        slo = slo_from_request(body.get("slo"))
    except (ValueError, TypeError) as e:
        raise bad_request("slo", str(e)) from None
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise bad_request("cache_salt", "cache_salt must be a non-empty string")
    session, kv_retention = body.get("session"), body.get("kv_retention")
    if session is not None and (not isinstance(session, str) or not session):
        raise bad_request("session", "session must be a non-empty string")
    if kv_retention is not None and not isinstance(kv_retention, dict):
        raise bad_request("kv_retention", "kv_retention must be an object such as {\"ttl_s\": 30} or {\"release\": true}")
    return {"session": session, "kv_retention": kv_retention,
            "cache_salt": salt, "tenant_given": body.get("tenant") is not None or body.get("user") is not None,
            "model": model, "sampling": _sampling(body), "stream": stream, "include_usage": include_usage,
            "priority": 0 if priority is None else priority, "tenant": _tenant(body), "n": n or 1, "slo": slo,
            "return_metrics": bool(_opt_bool(body, "return_metrics")), "segment_reuse": body.get("segment_reuse")}


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams kwargs common to both endpoints (not max_tokens, not logprobs)."""
    sampling: dict[str, Any] = {}
    prompt_logprobs = _opt_int(body, "prompt_logprobs", low=0, high=MAX_LOGPROBS)
    if prompt_logprobs is not None:
        sampling["prompt_logprobs"] = prompt_logprobs
    _vllm_fields(body, sampling)
    temperature = _opt_number(body, "temperature", 0.0, 2.0)
    sampling["temperature"] = 1.0 if temperature is None else temperature
    top_p = _opt_number(body, "top_p", 0.0, 1.0)
    if top_p is not None:
        if top_p <= 0.0:
            raise bad_request("top_p", f"top_p must be in (0, 1], got {top_p}")
        sampling["top_p"] = top_p
    top_k = _opt_int(body, "top_k", low=-1)
    if top_k is not None:
        sampling["top_k"] = max(top_k, 0)        # vLLM's -1 and 0 both mean "off"
    for name in ("seed", "min_tokens"):
        v = _opt_int(body, name, low=None if name == "seed" else 0)
        if v is not None:
            sampling[name] = v
    for name in ("presence_penalty", "frequency_penalty"):
        penalty = _opt_number(body, name, -2.0, 2.0)
        if penalty is not None:
            sampling[name] = penalty
    rep = body.get("repetition_penalty")
    if rep is not None:
        if isinstance(rep, bool) or not isinstance(rep, int | float) or not 0.0 < rep < math.inf:
            raise bad_request("repetition_penalty",
                              f"repetition_penalty must be a number > 0 (1 is off), got {rep!r}")
        sampling["repetition_penalty"] = float(rep)
    ignore_eos = _opt_bool(body, "ignore_eos")
    if ignore_eos is not None:
        sampling["ignore_eos"] = ignore_eos
    sampling["stop"] = _stop(body.get("stop"))
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None:
        if not isinstance(stop_ids, list) or not all(_is_int(t) and t >= 0 for t in stop_ids):
            raise bad_request("stop_token_ids", "stop_token_ids must be a list of non-negative integers")
        sampling["stop_token_ids"] = tuple(stop_ids)
    return sampling


def _vllm_fields(body: dict[str, Any], sampling: dict[str, Any]) -> None:
    """OpenAI's `logit_bias` ({token id (a string key): bias in [-100, 100]}) and vLLM's `min_p`,
    `allowed_token_ids`, `bad_words`, `truncate_prompt_tokens`, `thinking_token_budget` (>= 0)."""
    min_p = _opt_number(body, "min_p", 0.0, 1.0)
    if min_p is not None:
        sampling["min_p"] = min_p
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise bad_request("logit_bias", "logit_bias must be an object of token id -> bias in [-100, 100]")
        pairs = {}
        for key, value in bias.items():
            if not (isinstance(key, str) and key.isdigit()) and not _is_int(key):
                raise bad_request("logit_bias", f"logit_bias keys must be token ids, got {key!r}")
            if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
                raise bad_request("logit_bias", f"logit_bias values must be numbers in [-100, 100], got {value!r}")
            pairs[int(key)] = float(value)
        if pairs:
            sampling["logit_bias"] = pairs
    allowed = body.get("allowed_token_ids")
    if allowed is not None:
        if not isinstance(allowed, list) or not allowed or not all(_is_int(t) and t >= 0 for t in allowed):
            raise bad_request("allowed_token_ids", "allowed_token_ids must be a non-empty list of token ids (>= 0)")
        sampling["allowed_token_ids"] = tuple(allowed)
    bad_words = body.get("bad_words")
    if bad_words is not None:
        if not isinstance(bad_words, list) or not all(isinstance(w, str) and w for w in bad_words):
            raise bad_request("bad_words", "bad_words must be a list of non-empty strings")
        sampling["bad_words"] = tuple(bad_words)
    budget = _opt_int(body, "thinking_token_budget", low=0)
    if budget is not None:
        sampling["thinking_token_budget"] = budget
    truncate = _opt_int(body, "truncate_prompt_tokens", low=-1)
    if truncate == 0:
        raise bad_request("truncate_prompt_tokens", "truncate_prompt_tokens must be >= 1 (or -1: max_model_len), got 0")
    if truncate is not None:
        sampling["truncate_prompt_tokens"] = truncate


def _tenant(body: dict[str, Any]) -> str:
    for name in ("tenant", "user"):
        v = body.get(name)
        if v is None:
            continue
        if not isinstance(v, str) or not v:
            raise bad_request(name, f"{name} must be a non-empty string")
        return v
    return "default"


def _prompts(prompt: Any) -> list[str | list[int]]:
    if prompt is ...:
        raise bad_request("prompt", "prompt is required")
    if isinstance(prompt, str):
        return [_nonempty_text(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(_is_int(t) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return [_nonempty_text(p) for p in prompt]
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise bad_request("prompt", "prompt must be a non-empty string, a list of strings, a list of token ids "
                                "or a list of token-id lists")


def _nonempty_text(p: str) -> str:
    if not p:
        raise bad_request("prompt", "prompt must not be empty")
    return p


def _messages(messages: Any) -> list[dict[str, Any]]:
    if messages is ...:
        raise bad_request("messages", "messages is required")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "messages must be a non-empty list")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise bad_request(f"messages[{i}]", "each message must be an object")
        role = msg.get("role")
        if role not in _ROLES:
            raise bad_request(f"messages[{i}].role", f"role must be one of {', '.join(_ROLES)}; got {role!r}")
        entry: dict[str, Any] = {"role": role, "content": _content(msg.get("content"), i, role)}
        if role == "assistant" and msg.get("tool_calls") is not None:
            entry["tool_calls"] = parse_tool_calls(msg["tool_calls"], i)
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise bad_request(f"messages[{i}].tool_call_id", "a tool message needs its tool_call_id")
            entry["tool_call_id"] = call_id
        if msg.get("segment") is not None:   # segment reuse: mark (or unmark) this message's content
            entry["segment"] = _opt_bool(msg, "segment", f"messages[{i}].segment")
        out.append(entry)
    return out


def _content(content: Any, i: int, role: str) -> str:
    if isinstance(content, str):
        return content
    if content is None and role in ("assistant", "tool"):
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{i}].content", "only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"messages[{i}].content", "content must be a string or a list of text parts")


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("stop", "stop must be a non-empty string or a list of non-empty strings")
    return tuple(stop)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request(None, "the request body must be a JSON object")
    return body


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_int(body: dict[str, Any], name: str, low: int | None, high: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not _is_int(v):
        raise bad_request(name, f"{name} must be an integer, got {type(v).__name__}")
    if low is not None and v < low:
        raise bad_request(name, f"{name} must be >= {low}, got {v}")
    if high is not None and v > high:
        raise bad_request(name, f"{name} must be <= {high}, got {v}")
    return int(v)


def _opt_number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise bad_request(name, f"{name} must be a number, got {type(v).__name__}")
    if not low <= v <= high:
        raise bad_request(name, f"{name} must be in [{low:g}, {high:g}], got {v}")
    return float(v)


def _opt_bool(body: dict[str, Any], name: str, param: str | None = None) -> bool | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise bad_request(param or name, f"{param or name} must be a boolean, got {type(v).__name__}")
    return v


def _refuse_if(body: dict[str, Any], name: str, bad: Any, message: str) -> None:
    if name in body and bad(body[name]):
        raise bad_request(name, message)
