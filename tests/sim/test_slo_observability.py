"""What the slo policy decided, visible in `pacer sim`'s report, saved run and Chrome trace."""

from __future__ import annotations

import json
from pathlib import Path

from pacer.cli.main import main


def test_sim_reports_budgets_deadlines_slack_and_deprioritised(tmp_path: Path, capsys) -> None:
    out, trace = tmp_path / "run.json", tmp_path / "trace.json"
    rc = main(["sim", "--hardware", "h200-sxm", "--model", "llama-3.1-8b", "--workload", "mixed",
               "--request-rate", "400", "--num-prompts", "400", "--scheduling-policy", "slo",
               "--slo", "chat:ttft=300ms,itl=50ms", "--slo", "rag:ttft=2s", "--slo", "agent:ttft=500ms",
               "--slo", "batch:e2e=60s", "--out", str(out), "--chrome-trace", str(trace)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "deprio" in printed and "step budget: an ITL target set it in" in printed.replace("\n", " ")
    run = json.loads(out.read_text())
    budget = run["meta"]["budget"]
    # past capacity the queue's TTFTs, not the ITL target, size the budget in some steps (ttft drain)
    set_by_slo = budget["num_set_by_itl"] + budget["num_ttft_drain"]
    assert 0 < set_by_slo < budget["num_steps"] and budget["budget_median"] <= 2048
    reqs = run["requests"]
    chats = [r for r in reqs if r["class"] == "chat"]
    assert all(abs(r["ttft_deadline"] - r["arrival_time"] - 0.3) < 1e-9 for r in chats)
    assert all(r["ttft_deadline"] is None for r in reqs if r["class"] == "batch")   # e2e only
    assert all(r["slack_at_admission"] is not None for r in chats)
    num_depri = sum(r["deprioritized"] for r in reqs)
    assert num_depri == run["summary"]["overall"]["num_deprioritized"] > 0   # 400 req/s is past capacity
    events = json.loads(trace.read_text())["traceEvents"]
    steps = [e for e in events if e.get("pid") == 0 and e["ph"] == "X"]
    spans = [e for e in events if e.get("pid") == 1 and e["ph"] == "X"]
    assert len(steps) == run["meta"]["sim"]["num_steps"]
    assert any(e["args"]["budget_reason"].startswith(("itl ", "ttft drain")) for e in steps)
    assert len(spans) == len(reqs)
    assert sum(e["args"]["deprioritized"] for e in spans) == num_depri
    assert all(e["args"]["missed_ttft"] for e in spans if e["args"]["deprioritized"])
