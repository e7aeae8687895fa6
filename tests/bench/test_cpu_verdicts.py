"""benchmarks/cpu_verdicts.py judges issue 26's bars on the figures its benchmarks report: each bar
at its edge, and a figure the run did not produce is "not measured", never met."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import cpu_verdicts  # noqa: E402


def results(**over: Any) -> dict[str, Any]:
    """The RESULT dicts of the four benchmarks, every bar just met."""
    res: dict[str, Any] = {
        "offline": {"w": {"float32": {"pacer": 110.0, "pacer-gguf+int8": 120.0, "vllm": 110.0}},
                    "varied": {"float32": {"pacer": 101.0, "vllm": 100.0}},
                    "batch1_ms": {"float32 pacer": 30.0, "float32 pacer-gguf+int8": 7.0, "llama.cpp Q4_1": 7.0}},
        "quantized": {"speed": {"float32": {"b32_tok_s": 400.0, "prefill_tok_s": 800.0},
                                "q-int8": {"b32_tok_s": 600.0, "prefill_tok_s": 1040.0}},
                      "quality": {"q-float": {"kl_max": 1e-3, "kl_mean": 1e-7, "agreement": 0.99, "near_ties": 2,
                                              "other": 0, "tokens": 64},
                                  "q-int8": {"kl_max": 0.02, "kl_mean": 0.01, "agreement": 0.95, "near_ties": 1,
                                             "other": 12, "tokens": 64}}},
        "online": {"pacer fcfs|0.3|1": {"output_tok_s": 22.1}, "vllm serve|0.3|1": {"output_tok_s": 22.1}},
        "sim": {"requests": 10_000, "wall_s": 9.99},
    }
    res.update(over)
    return res


def test_every_bar_met_at_its_edge() -> None:
    vs = cpu_verdicts.verdicts(results())
    assert len(vs) == 9
    assert [v.item for v in vs if v.met is not True] == []


def test_each_bar_fails_just_past_its_edge() -> None:
    def failing(res: dict[str, Any]) -> list[str]:
        return [v.item for v in cpu_verdicts.verdicts(res) if v.met is False]

    res = results()
    res["offline"]["w"]["float32"]["pacer"] = 109.0
    res["offline"]["batch1_ms"]["float32 pacer-gguf+int8"] = 7.1
    assert len(failing(res)) == 2
    res = results()
    res["quantized"]["speed"]["q-int8"]["b32_tok_s"] = 599.0
    res["quantized"]["quality"]["q-float"]["other"] = 1            # a greedy token that is no near-tie
    res["quantized"]["quality"]["q-int8"]["agreement"] = 0.949
    assert len(failing(res)) == 3
    assert len(failing(results(sim={"requests": 10_000, "wall_s": 10.0}))) == 1


def test_missing_figures_are_not_measured() -> None:
    vs = cpu_verdicts.verdicts({"offline": None, "quantized": None, "sim": None})
    assert [v.met for v in vs] == [None] * 9
    short = results(sim={"requests": 500, "wall_s": 0.5})   # not the 10,000 of the bar
    short["quantized"]["quality"]["q-int8"]["tokens"] = 16
    vs = {v.item: v.met for v in cpu_verdicts.verdicts(short)}
    assert sum(met is None for met in vs.values()) == 2
