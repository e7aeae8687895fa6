"""The decomposition adds up to e2e exactly, part by part, on hand-made records."""

from __future__ import annotations

import pytest

from pacer.diagnose.decompose import decompose, decompose_all, mean_parts
from pacer.diagnose.records import Record


def rec(**kw):
    base = dict(request_class="chat", prompt_tokens=100, output_tokens=9, ttft=1.5, e2e=4.0)
    base.update(kw)
    return Record(**base)


def test_measured_parts_with_queue_and_preemption_split():
    # queue 0.5; 0.25 s of the loss before the first token, 0.75 s after it
    p = decompose(rec(queue_wait=0.5, preempted_time=1.0, preempted_time_ttft=0.25, preemptions=1))
    assert (p.queue, p.prefill, p.decode, p.preemption) == (0.5, 0.75, 1.75, 1.0)
    assert p.total == 4.0 and not p.preemption_estimated


def test_without_queue_wait_prefill_is_all_of_ttft():
    p = decompose(rec(preempted_time=0.0, preempted_time_ttft=0.0))
    assert (p.queue, p.prefill, p.decode, p.preemption) == (0.0, 1.5, 2.5, 0.0)


def test_total_loss_only_goes_after_the_first_token_first():
    # decode side is 2.5 s; a 3 s loss cannot all be after the first token: 0.5 s of it is before
    p = decompose(rec(queue_wait=0.25, preempted_time=3.0))
    assert (p.queue, p.prefill, p.decode, p.preemption) == (0.25, 0.75, 0.0, 3.0)
    assert p.total == 4.0


def test_loss_estimated_from_the_longest_gap_when_only_a_count_is_known():
    p = decompose(rec(queue_wait=0.5, preemptions=2, tpot=0.25, itl_max=1.25))
    assert (p.queue, p.prefill, p.decode, p.preemption) == (0.5, 1.0, 1.5, 1.0)
    assert p.preemption_estimated


def test_loss_estimated_from_the_class_tpot_without_gaps():
    clean = rec(tpot=0.25, e2e=3.5)                    # 8 gaps x 0.25 = 2.0 s of decode
    hit = rec(preemptions=1, e2e=5.0)                  # decode 3.5 s: 1.5 s more than 8 x 0.25
    parts = decompose_all([clean, hit])
    assert parts[1].preemption == 1.5 and parts[1].decode == 2.0 and parts[1].preemption_estimated
    assert parts[0].preemption == 0.0 and parts[0].decode == 2.0


def test_unpreempted_requests_lose_nothing_to_preemption():
    p = decompose(rec(queue_wait=0.5, preemptions=0, tpot=0.25, itl_max=1.25))
    assert p.preemption == 0.0 and p.decode == 2.5


def test_mean_parts_is_the_mean_of_each_part():
    a = decompose(rec(queue_wait=0.5, preempted_time=1.0, preempted_time_ttft=0.25))
    b = decompose(rec(queue_wait=1.5, ttft=2.0, e2e=3.0, preempted_time=0.0, preempted_time_ttft=0.0))
    m = mean_parts([a, b])
    assert (m.queue, m.prefill, m.decode, m.preemption) == (1.0, 0.625, 1.375, 0.5)
    assert m.total == pytest.approx((4.0 + 3.0) / 2)
