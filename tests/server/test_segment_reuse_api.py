"""Segment reuse over HTTP: with --segment-reuse approximate the server marks each tool message's
content as a segment (from the chat template's render); a second conversation carrying the same
tool output after another history reuses its stored KV, and usage.prompt_tokens_details says how
many prompt tokens were reused and recomputed (absent when none were)."""

from __future__ import annotations

import openai

from pacer.workload.text import TextSource
from tests.conftest import make
from tests.server.conftest import MODEL, serve


def test_a_tool_output_after_another_history_is_reused(base):
    import random

    src = TextSource(base.tokenizer)
    rng = random.Random(5)
    tool = src.segment(120, rng).text
    engine = make(base, segment_reuse="approximate", segment_recompute=0.25)
    with serve(engine) as served:
        client = openai.OpenAI(base_url=served.v1, api_key="x")
        usages = []
        for history in ("Find me a flight to Lisbon next week.", "What is the weather in Porto tomorrow, roughly?"):
            messages = [{"role": "user", "content": history},
                        {"role": "assistant", "content": "Calling the search tool.", "tool_calls": [
                            {"id": "call_1", "type": "function",
                             "function": {"name": "search", "arguments": "{}"}}]},
                        {"role": "tool", "tool_call_id": "call_1", "content": tool},
                        {"role": "user", "content": "Summarize the result."}]
            r = client.chat.completions.create(model=MODEL, max_tokens=2, temperature=0, messages=messages)
            usages.append(r.usage.prompt_tokens_details)
    assert getattr(usages[0], "reused_tokens", None) is None                  # the first one stored it
    reused, recomputed = usages[1].reused_tokens, usages[1].recomputed_tokens  # the extension's fields
    assert recomputed > 0 and reused > 60 and reused + recomputed <= 125
