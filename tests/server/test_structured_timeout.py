"""A pathological grammar (an injected compiler that spins its worker's core) fails its own
request with a 400 naming the field when --structured-outputs-timeout passes, while another
request keeps streaming: the test counts the tokens that stream received during the
timeout, not wall time. The timed-out worker process is gone afterwards."""

from __future__ import annotations

import os
import threading

import openai
import pytest

from pacer.request import StructuredOutputsParams
from pacer.structured.manager import StructuredOutputManager
from tests.server.conftest import MODEL, serve, wait_for

SLOW_SCHEMA = {"title": "slow", "type": "object"}


@pytest.fixture(scope="module")
def served(llm):
    engine = llm.engine
    manager = StructuredOutputManager(engine.tokenizer, engine.vocab_size, engine.eos_token_ids, timeout=2.0,
                                      num_workers=1, compiler="tests.structured.slow_compiler:compile_spec")
    manager.request(StructuredOutputsParams(choice=["warm"])).result(120)   # the worker is up
    engine.install_structured_outputs(manager)
    with serve(engine) as s:
        yield s
    engine.install_structured_outputs(None)


def test_slow_grammar_times_out_alone_while_others_stream(served):
    client = openai.OpenAI(base_url=served.v1, api_key="none", max_retries=0, timeout=120)
    manager = served.service.engine.structured_outputs
    pid = manager.all_workers[0].pid
    received: list[int] = []
    done = threading.Event()

    def stream_other() -> None:
        for chunk in client.completions.create(model=MODEL, prompt="Count: 1, 2, 3,", max_tokens=300,
                                               temperature=0, stream=True, extra_body={"ignore_eos": True}):
            if chunk.choices and chunk.choices[0].text:
                received.append(1)
        done.set()

    other = threading.Thread(target=stream_other)
    other.start()
    wait_for(lambda: len(received) >= 3, 120, "the other stream to start")
    before = len(received)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                       stream=True, response_format={"type": "json_schema", "json_schema": {
                                           "name": "slow", "schema": SLOW_SCHEMA}})
    during = len(received) - before
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "did not compile within 2 s" in e.value.body["message"]
    assert during >= 3 or done.is_set(), f"the other stream stalled during the compile ({during} tokens)"
    other.join(300)
    assert len(received) >= 250   # it finished normally
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)   # the spinning worker was killed, not left burning a core
    assert manager.stats.timeouts == 1
