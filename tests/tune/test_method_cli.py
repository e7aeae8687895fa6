"""`pacer tune` follows the method: each step printed with its evidence; --from-log takes the
traffic from anything `pacer diagnose` reads."""

from __future__ import annotations

import json

from pacer.cli.main import main

SIM = ["--hardware", "a100-80g", "--model", "llama-3-8b"]


def test_method_prints_each_step_and_the_choice(capsys):
    rc = main(["tune", *SIM, "--workload", "fixed", "--input-len", "240", "--output-len", "128",
               "--request-rate", "inf", "--num-prompts", "48", "--num-kv-blocks", "368", "--slo", "tpot=40ms",
               "--max-num-seqs", "4,8,16,32,64", "--max-num-batched-tokens", "1024,4096"])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    steps = [next(i for i, line in enumerate(lines) if line.startswith(f"({k})")) for k in range(1, 6)]
    assert steps == sorted(steps)                                    # the SLA first, then CV, knee, budget, chunked
    assert "tpot<=40 ms" in lines[steps[0]] and "CV" in lines[steps[1]]
    assert "knee: max_num_seqs 16 (preemptions start above it)" in out
    assert "chosen: --max-num-seqs 16" in out and "runner-up:" in out


def test_from_log_reads_a_table_and_needs_an_sla(tmp_path, capsys):
    rows = [{"input_tokens": 200 + 10 * i, "output_tokens": 64, "ttft": 0.2, "total_latency": 2.0,
             "timestamp": i * 0.05, "feature": "chat"} for i in range(30)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert main(["tune", *SIM, "--from-log", str(path), "--slo", "ttft=1s", "--max-num-seqs", "8,32",
                 "--max-num-batched-tokens", "2048"]) == 0
    out = capsys.readouterr().out
    assert f"(2) traffic: 30 requests ({path}, at the source's timestamps)" in out
    assert main(["tune", *SIM, "--from-log", str(path)]) == 2
    assert "needs an SLO" in capsys.readouterr().err
