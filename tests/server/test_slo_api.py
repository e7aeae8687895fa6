"""Per-request targets over HTTP (the official `openai` client): the body's `slo`, llm-d's
headers, the declared class, their errors, and the per-class attainment counters in /metrics."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pacer.telemetry.request_log import read_request_log
from tests.server.conftest import MODEL, serve


@pytest.fixture(scope="module")
def served(llm, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("slo") / "requests.jsonl"
    with serve(llm.engine, "--request-log", str(log_path)) as s:
        s.log_path = log_path
        yield s


def _slo_counts(base_url: str) -> dict[tuple[str, str], float]:
    text = httpx.get(base_url + "/metrics").text
    return {(s.labels["class"], s.labels["result"]): s.value for fam in text_string_to_metric_families(text)
            if fam.name == "pacer_request_slo" for s in fam.samples if s.name.endswith("_total")}


def test_request_targets_count_per_class_and_reach_the_log(served) -> None:
    client = openai.OpenAI(base_url=served.v1, api_key="x")
    client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0,
                              extra_body={"slo": {"ttft_ms": 600000, "itl_ms": 600000}})
    client.completions.create(model=MODEL, prompt="Roses are red,", max_tokens=4, temperature=0,
                              extra_body={"slo": {"ttft_ms": 0.001}}, extra_headers={"x-pacer-class": "long_context"})
    client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0,
                              extra_headers={"x-llm-d-slo-ttft-ms": "600000", "x-pacer-class": "batch"})
    counts = _slo_counts(served.base_url)
    assert counts[("chat", "met")] >= 1 and counts[("rag", "missed")] >= 1 and counts[("batch", "met")] >= 1
    rows = read_request_log(served.log_path)
    assert {r["class"] for r in rows} >= {"chat", "rag", "batch"}
    missed = next(r for r in rows if r["class"] == "rag")
    assert missed["slo_met"] is False and missed["ttft_deadline"] is not None and missed["shed"] is False


@pytest.mark.parametrize(("kwargs", "param", "words"), [
    ({"extra_body": {"slo": {"ttft": 300}}}, "slo", "unknown key 'ttft'"),
    ({"extra_body": {"slo": {"itl_ms": -1}}}, "slo", "slo.itl_ms must be a number of milliseconds > 0"),
    ({"extra_body": {"slo": "fast"}}, "slo", "slo must be an object"),
    ({"extra_headers": {"x-pacer-class": "video"}}, "x-pacer-class", "request class 'video'"),
    ({"extra_headers": {"x-llm-d-slo-tpot-ms": "soon"}}, "x-llm-d-slo-tpot-ms", "milliseconds"),
])
def test_bad_targets_are_400s_naming_the_field(served, kwargs, param, words) -> None:
    client = openai.OpenAI(base_url=served.v1, api_key="x")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, **kwargs)
    err = e.value.body
    assert err["param"] == param and words in err["message"]
