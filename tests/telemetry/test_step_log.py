"""`pacer serve --step-log`: a line per engine step, read back and priced with a cost model."""

from __future__ import annotations

import openai
import pytest

from pacer.perf.cost_model import BatchFeatures, make_cost_model
from pacer.perf.profiles import get_hardware, get_model
from pacer.telemetry.step_log import FEATURE_KEYS, priced_work_s, read_step_log
from tests.server.conftest import MODEL, serve


@pytest.fixture(scope="module")
def served(llm, tmp_path_factory):
    path = tmp_path_factory.mktemp("steps") / "steps.jsonl"
    with serve(llm.engine, "--step-log", str(path)) as s:
        s.log_path = path
        yield s


def _complete(served, prompt: str, max_tokens: int):
    client = openai.OpenAI(base_url=served.v1, api_key="x")
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                     extra_body={"ignore_eos": True})


def test_each_step_of_a_request_is_a_line_with_its_batch(served) -> None:
    before = len(read_step_log(served.log_path))
    out = _complete(served, "A step log lists every engine step: zebra quartz lantern", 5)
    rows = read_step_log(served.log_path, skip_lines=before)
    assert sum(r["num_prefill_tokens"] for r in rows) == out.usage.prompt_tokens   # a prompt no cache holds
    # the first token comes with the prompt's last chunk, each of the other four with a decode step
    assert sum(r["num_decode_tokens"] for r in rows) == out.usage.completion_tokens - 1 == 4
    assert [r["kind"] for r in rows][-4:] == ["decode"] * 4
    assert all(r["measured_s"] >= r["forward_s"] > 0 for r in rows)
    assert [r["step_id"] for r in rows] == sorted({r["step_id"] for r in rows})
    assert all(r["end_time"] <= s["end_time"] for r, s in zip(rows, rows[1:]))


def test_a_run_priced_by_a_cost_model_is_the_sum_of_its_steps(served) -> None:
    before = len(read_step_log(served.log_path))
    _complete(served, "Pricing the steps of one run: violet anchor meadow", 3)
    rows = read_step_log(served.log_path, skip_lines=before)
    model = make_cost_model(get_hardware("h100-sxm"), get_model(None), "bfloat16")
    each = [model.step_cost(BatchFeatures(**{k: r[k] for k in FEATURE_KEYS})).time_s for r in rows]
    assert len(rows) >= 3 and all(t > 0 for t in each)
    assert priced_work_s(rows, model) == pytest.approx(sum(each))
    assert priced_work_s(rows[:1], model) < priced_work_s(rows, model)
