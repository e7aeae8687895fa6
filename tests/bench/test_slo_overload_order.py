"""benchmarks/slo_overload.py's run order: pacer's two servers up together and taking each trace
back to back, each first on half the traces over a repeat pair; vLLM's server alone."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import slo_overload  # noqa: E402


def _engines(vllm: bool) -> list[tuple[str, list[str], dict[str, str]]]:
    args = argparse.Namespace(pacer_args="", policies="fcfs,slo", vllm="/venv" if vllm else None,
                              vllm_model="/m", vllm_args="--max-model-len 4096")
    return slo_overload.engines(args, 0)


def test_pacer_servers_form_one_group_and_vllm_stands_alone() -> None:
    for rep in range(4):
        groups = slo_overload._groups(slo_overload._order(_engines(True), rep), together=True)
        names = [[e[0] for e in g] for g in groups]
        assert sorted(map(sorted, names)) == [["pacer fcfs", "pacer slo"], ["vllm serve"]]
    serial = slo_overload._groups(slo_overload._order(_engines(True), 0), together=False)
    assert [len(g) for g in serial] == [1, 1, 1]


def test_each_policy_runs_first_on_as_many_traces() -> None:
    first = {"pacer fcfs": 0, "pacer slo": 0}
    for rep in range(2):
        (group,) = slo_overload._groups(slo_overload._order(_engines(False), rep), together=True)
        live = [slo_overload._Live(name, name, "", None, None, 0) for name, *_ in group]
        for trace in range(3):
            turn = slo_overload._turns(live, trace)
            assert sorted(e.name for e in turn) == ["pacer fcfs", "pacer slo"]
            first[turn[0].name] += 1
    assert first == {"pacer fcfs": 3, "pacer slo": 3}


def test_on_port_replaces_only_the_port() -> None:
    cmd = _engines(False)[0][1]
    moved = slo_overload._on_port(cmd, 4242)
    assert moved[moved.index("--port") + 1] == "4242"
    assert len(moved) == len(cmd) and [a for a in moved if a != "4242"] == [a for a in cmd if a != "0"]
