"""Per-request metrics in the response (`--enable-per-request-metrics`, or the body's
`return_metrics`) through the official `openai` client: the engine's queue wait, TTFT, ITL,
TPOT and cached tokens, and the request's SLO targets, slack and whether each was met."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import MODEL, serve


@pytest.fixture(scope="module")
def client(llm):
    with serve(llm.engine, "--enable-per-request-metrics") as s, \
            openai.OpenAI(base_url=s.v1, api_key="none", max_retries=0) as c:
        yield c


def test_each_choice_carries_its_metrics_and_slo_verdicts(client):
    r = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=4, temperature=0, n=2,
                                  extra_body={"slo": {"ttft_ms": 600000, "tpot_ms": 0.001}, "ignore_eos": True})
    metrics = r.model_extra["metrics"]
    assert [m["index"] for m in metrics] == [0, 1]
    for m in metrics:
        assert m["output_tokens"] == 4 and m["ttft_ms"] >= m["queue_wait_ms"] >= 0
        assert m["itl_max_ms"] >= m["itl_p50_ms"] > 0 and m["tpot_ms"] > 0
        assert m["slo"]["targets"]["ttft_ms"] == 600000 and m["slo"]["met"] == {"ttft": True, "tpot": False}
        assert m["slo"]["all_met"] is False


def test_streamed_metrics_come_last(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=2, stream=True))
    assert chunks[-1].choices == [] and chunks[-1].model_extra["metrics"][0]["output_tokens"] >= 1
