"""Validation arithmetic: relative errors against per-metric tolerances; the in-run refit."""

from __future__ import annotations

from pacer.engine.stats import StepStats
from pacer.perf.cost_model import LINEAR_FEATURES, LinearCostModel
from pacer.perf.profiles import get_hardware, get_model
from pacer.sched.contract import ScheduledRequest, SchedulerOutput
from pacer.sim.validate import StepRecorder, compare_summaries, format_errors, refit_on_steps


def test_errors_against_tolerances():
    real = {"ttft_p50": 0.100, "ttft_p99": 1.0, "tpot_p50": 0.050, "tpot_p99": None, "output_tok_s": 100.0}
    sim = {"ttft_p50": 0.109, "ttft_p99": 1.25, "tpot_p50": 0.050, "tpot_p99": 0.2, "output_tok_s": 89.0}
    errs = {e.metric: e for e in compare_summaries(real, sim)}
    assert errs["ttft_p50"].ok and abs(errs["ttft_p50"].rel_error - 0.09) < 1e-9
    assert not errs["ttft_p99"].ok            # +25% > 20%
    assert errs["tpot_p50"].ok
    assert errs["tpot_p99"].rel_error is None and not errs["tpot_p99"].ok
    assert not errs["output_tok_s"].ok        # -11%
    lines = format_errors(list(errs.values()))
    assert any("MISS" in line for line in lines) and any("+9.0%" in line for line in lines)


def _stats(out: SchedulerOutput, total_s: float, t: float) -> StepStats:
    """The engine's record of a step that took `total_s` (all of it forward) and ended at `t`."""
    return StepStats(step_id=out.step_id, time=t, num_running=0, num_waiting=0, batch_size=len(out.scheduled),
                     num_prefill_tokens=out.num_prefill_tokens, num_decode_tokens=out.num_decode_tokens,
                     num_preempted=0, kv_usage=0.0, schedule_s=0.0, prepare_s=0.0, forward_s=total_s, sample_s=0.0,
                     update_s=0.0, token_budget=64 + out.step_id, budget_reason=f"itl {out.step_id}")


def test_refit_on_recorded_steps_recovers_the_step_times():
    hw, model = get_hardware("cpu-local"), get_model("smollm2-135m")
    true = dict.fromkeys(LINEAR_FEATURES, 0.0) | {"const": 0.01, "tokens": 0.002, "single_kv_tokens": 1e-5}
    truth = LinearCostModel(hw, model, "float32", true)
    rec = StepRecorder()
    t = 0.0
    for i in range(40):
        rows = [ScheduledRequest(f"d{j}", [1], 100 + 10 * i, [], False, True, False, 0) for j in range(1 + i % 7)]
        if i % 5 == 0:
            rows.append(ScheduledRequest("p", list(range(16 * (i + 1))), 0, [], True, True, True, 0))
        out = SchedulerOutput(i, rows, sum(r.num_tokens for r in rows if r.is_prefill),
                              sum(r.num_tokens for r in rows if not r.is_prefill))
        rec.on_schedule(out)
        dt = truth.step_cost(rec.features[i]).time_s
        t += dt
        rec.on_stats(_stats(out, dt, t))
    coef, fit = refit_on_steps(rec, model, hw, "float32")
    assert fit.n == 40 and fit.max_rel_err < 1e-3
    assert any("measured/predicted median 1.00" in line for line in rec.step_errors(truth))
    rows = rec.step_rows(truth)
    assert [r["step_id"] for r in rows] == list(range(40))
    assert [r["kind"] for r in rows[:2]] == ["mixed", "decode"]
    assert all(abs(r["measured_s"] - r["predicted_s"]) < 1e-12 for r in rows)
    assert rows[5]["num_prefill_tokens"] == 96 and rows[5]["chunk_kv_tokens"] == 96
    assert rows[7]["token_budget"] == 71 and rows[7]["budget_reason"] == "itl 7"
