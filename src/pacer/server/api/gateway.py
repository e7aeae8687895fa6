"""What routers and gateways read besides the OpenAI API, as vLLM serves it:
`POST /tokenize`, `POST /detokenize`, `GET /version`, and llm-d's fairness header as the
tenant when the body names none. (`vllm:cache_config_info` is in `pacer.telemetry.prometheus`; KV
events are `pacer.telemetry.kv_events`.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI

from pacer import __version__
from pacer.server.api import errors
from pacer.server.api.protocol import ParsedRequest
from pacer.server.tools.template import template_error

__all__ = ["add_router_endpoints", "tenant_from_headers", "tokenize_body", "detokenize_body",
           "FAIRNESS_HEADER"]

FAIRNESS_HEADER = "x-llm-d-inference-fairness-id"   # llm-d's flow-control / fairness id


def tenant_from_headers(parsed: ParsedRequest, headers: Mapping[str, str]) -> ParsedRequest:
    """The fairness id header is the tenant when neither `tenant` nor `user` is in the body."""
    value = headers.get(FAIRNESS_HEADER)
    if parsed.tenant_given or not value:
        return parsed
    return dataclasses.replace(parsed, tenant=value)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise errors.bad_request(None, "the request body must be a JSON object")
    return body


def tokenize_body(tokenizer: Any, body: Any, max_model_len: int) -> dict[str, Any]:
    """vLLM's /tokenize: `prompt` (text) or `messages` (chat template; `add_generation_prompt`,
    default true); `add_special_tokens` is accepted. Returns count, max_model_len, tokens.
    Any thread: the server runs it off the event loop, after the key's charge."""
    body = _object(body)
    if tokenizer is None:
        raise errors.bad_request(None, "this model has no tokenizer")
    if "messages" in body:
        messages = body["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise errors.bad_request("messages", "messages must be a list of objects")
        add_gen = body.get("add_generation_prompt", True)
        if not isinstance(add_gen, bool):
            raise errors.bad_request("add_generation_prompt", "add_generation_prompt must be a boolean")
        try:
            ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=add_gen))
        except Exception as e:   # template errors are the client's input
            raise template_error(e) from None
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise errors.bad_request("prompt", "prompt (a string) or messages is required")
        ids = tokenizer.encode(prompt) if prompt else []
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}


def detokenize_body(tokenizer: Any, body: Any, vocab_size: int | None) -> dict[str, Any]:
    body = _object(body)
    if tokenizer is None:
        raise errors.bad_request(None, "this model has no tokenizer")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in tokens):
        raise errors.bad_request("tokens", "tokens must be a list of non-negative integers")
    if vocab_size is not None and tokens and max(tokens) >= vocab_size:
        raise errors.bad_request("tokens", f"token ids must be in [0, {vocab_size})")
    return {"prompt": tokenizer.decode(tokens, skip_special_tokens=False)}


def add_router_endpoints(app: FastAPI) -> None:
    """`GET /version`; /tokenize and /detokenize are the app's (they charge the caller's key)."""
    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}
