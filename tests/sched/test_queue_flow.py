"""What the slo policy measures of its queue (pacer.sched.queue_flow): the typical prompt of the
tightest TTFT class."""

from __future__ import annotations

from pacer.config.slo import Slo
from pacer.request import Request, SamplingParams
from pacer.sched.queue_flow import TYPICAL_WINDOW, QueueFlow

PARAMS = SamplingParams(max_tokens=4)


def _arrivals(sizes_and_slos: list[tuple[int, Slo | None]], first_seq: int = 0) -> list[Request]:
    return [Request(f"r{first_seq + i}", [1] * n, PARAMS, arrival_time=float(first_seq + i), slo=slo,
                    arrival_seq=first_seq + i) for i, (n, slo) in enumerate(sizes_and_slos)]


def test_the_typical_prompt_is_the_median_of_the_classes_at_least_as_tight() -> None:
    flow = QueueFlow()
    chat, rag = Slo(ttft=1.0, itl=0.2), Slo(ttft=8.0)
    assert flow.typical_prompt(1.0) is None
    queue = _arrivals([(100, chat), (3000, rag), (140, chat), (2500, rag), (120, chat), (50, None)])
    flow.note(queue, backlogged=True, now=6.0)
    flow.note(queue, backlogged=True, now=7.0)      # seen once: the same queue adds nothing
    assert flow.typical_prompt(1.0) == 120           # the rag prompts and the untargeted one do not count
    assert flow.typical_prompt(8.0) == 140           # 100 120 140 2500 3000
    assert flow.typical_prompt(0.5) is None


def test_the_typical_prompt_follows_the_recent_arrivals() -> None:
    flow = QueueFlow()
    chat = Slo(ttft=1.0)
    flow.note(_arrivals([(100, chat)] * TYPICAL_WINDOW), backlogged=False, now=40.0)
    assert flow.typical_prompt(1.0) == 100
    flow.note(_arrivals([(900, chat)] * (TYPICAL_WINDOW // 2 + 1), first_seq=TYPICAL_WINDOW), backlogged=False, now=80.0)
    assert flow.typical_prompt(1.0) == 900
