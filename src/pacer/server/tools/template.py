"""Chat prompts with tools: the model's own chat template when it knows about tools, else
the tool-aware ChatML template pacer ships (`templates/chatml_tools.jinja`, Hermes tool
format); `--chat-template PATH` overrides both, for every request, as in vLLM, and may name
a template pacer ships (`qwen3`: Qwen3-style, thinking in `<think>`, `enable_thinking`).
`chat_template_kwargs` (vLLM's request field, over `--default-chat-template-kwargs`) are the
template's extra variables."""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from typing import Any

from pacer.server.api import errors

__all__ = ["render_chat", "shipped_template", "load_chat_template", "template_error", "SHIPPED_TEMPLATES",
           "RESERVED_TEMPLATE_KWARGS"]

SHIPPED_TEMPLATES = ("chatml_tools", "qwen3")   # --chat-template NAME: templates/NAME.jinja
# apply_chat_template's own arguments: a request may not set them through chat_template_kwargs
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs"})


@cache
def shipped_template(name: str = "chatml_tools") -> str:
    return resources.files("pacer.server.tools").joinpath(f"templates/{name}.jinja").read_text(encoding="utf-8")


def load_chat_template(path: str) -> str:
    """--chat-template: a file with a Jinja template, or the name of one pacer ships."""
    if path in SHIPPED_TEMPLATES and not os.path.exists(path):
        return shipped_template(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"--chat-template {path}: {e}") from None
    if not text.strip():
        raise ValueError(f"--chat-template {path}: the file is empty")
    return text


def _template_for(tokenizer: Any, tools: list[dict[str, Any]] | None, override: str | None) -> str | None:
    if override is not None:
        return override
    own = tokenizer.hf.chat_template
    if not tools:
        return None
    if isinstance(own, str) and "tools" in own:
        return None
    return shipped_template()


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                chat_template: str | None = None, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of `messages` (with `tools`) rendered for generation; `template_kwargs`: the
    template's extra variables (e.g. enable_thinking)."""
    template = _template_for(tokenizer, tools, chat_template)
    if template is None and not tools and not template_kwargs:
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    if template is None and not tokenizer.hf.chat_template:
        raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
    text = tokenizer.hf.apply_chat_template(messages, tools=tools or None, chat_template=template,
                                            add_generation_prompt=True, tokenize=False, **(template_kwargs or {}))
    return list(tokenizer.hf.encode(text, add_special_tokens=False))


def render_chat_segments(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                         chat_template: str | None = None, template_kwargs: dict[str, Any] | None = None,
                         roles: tuple[str, ...] = ("tool",)) -> tuple[list[int], list[tuple[int, int]]]:
    """`render_chat`'s token ids and the token spans of the segment messages' contents: the `roles`
    messages' (segment reuse's default segments: tool outputs, `pacer.sched.segments`) and those a
    client marked `"segment": true` (`Tokenizer.with_segments`)."""
    template = _template_for(tokenizer, tools, chat_template)
    if template is None and not tokenizer.hf.chat_template:
        raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
    text = tokenizer.hf.apply_chat_template(messages, tools=tools or None, chat_template=template,
                                            add_generation_prompt=True, tokenize=False, **(template_kwargs or {}))
    ids, spans = tokenizer.with_segments(text, messages, roles)
    return list(ids), spans


def template_error(e: Exception) -> errors.APIError:
    """A chat template that failed on the client's messages: a 400. A template's own error
    (jinja's `raise_exception`, a TypeError or ValueError on the input) is shown; anything
    else is logged with an id and only the id is shown."""
    from jinja2 import TemplateError

    if isinstance(e, TemplateError | TypeError | ValueError):
        return errors.bad_request("messages", f"cannot apply the chat template: {e}")
    error_id = errors.log_error("the chat template failed", e)
    return errors.bad_request("messages", f"cannot apply the chat template to these messages (error id {error_id})")
