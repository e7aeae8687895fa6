"""Per-request spans for the simulator's Chrome trace: arrival to first token (or to the end,
for a request that never streamed), one row per class, with what the slo policy decided."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pacer.workload.report import STATUS_REJECTED, RequestRecord

__all__ = ["request_spans"]


def request_spans(records: Sequence[RequestRecord], t0: float = 0.0) -> list[dict[str, Any]]:
    """Chrome trace events (pid 1, one thread per class) for `records` (times from the run's
    start `t0` on the simulated clock): name = request id; args: TTFT deadline, slack at
    admission, deprioritised, shed, queue wait."""
    classes: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    for r in records:
        tid = classes.setdefault(r.request_class, len(classes))
        end = r.first_token_time if r.first_token_time is not None else r.finish_time
        if end is None:
            continue
        events.append({
            "name": r.request_id, "ph": "X", "pid": 1, "tid": tid, "ts": (t0 + r.arrival_time) * 1e6,
            "dur": max(0.0, end - r.arrival_time) * 1e6,
            "args": {"class": r.request_class, "ttft_deadline_s": r.ttft_deadline,
                     "slack_at_admission_s": r.slack_at_admission, "deprioritized": r.deprioritized,
                     "shed": r.status == STATUS_REJECTED, "queue_wait_s": r.queue_wait,
                     "missed_ttft": r.ttft_deadline is not None and end > r.ttft_deadline},
        })
    events += [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": f"requests: {name}"}}
               for name, tid in classes.items()]
    events.append({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "requests (arrival to first token)"}})
    return events
