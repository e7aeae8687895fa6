"""The scheduler's per-row shortcuts (issue 26 item 5) decide what the long way decides: a hook
a policy does not override is skipped only when it is the no-op default, and a decode row's
ledger charge adds exactly what `charge` adds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.request import Request, SamplingParams, TokenPrefix
from pacer.sched.fair_share import ServiceCosts, ServiceLedger
from pacer.sched.policy import Policy, PolicyContext
from pacer.sched.policy_factory import POLICIES, make_policy
from tests.fakes import FixedCostModel, make_engine, run


def test_overrides_names_the_hooks_a_policy_replaces():
    ctx = PolicyContext(max_num_batched_tokens=512, prefill_chunk=256, cost_model=FixedCostModel(1e-3, 1e-4))
    fcfs, fair = make_policy("fcfs", ctx), make_policy("fair", ctx)
    assert not fcfs.overrides("account") and not fcfs.overrides("prefill_cap")
    assert fair.overrides("account") and fair.overrides("prefill_cap")
    for name in POLICIES:   # the fair policies charge their ledger in account, slo measures its prefill rate
        assert make_policy(name, ctx).overrides("account") == (name.startswith("fair") or name == "slo"), name


def test_a_capping_policy_is_still_asked_for_every_running_chunk():
    """The scheduler skips `prefill_cap` only for the default: a policy's cap still shapes chunks."""
    calls: list[str] = []

    class Capped(Policy):
        def prefill_cap(self, req: Request, cap: int) -> int:
            calls.append(req.request_id)
            return 8

    eng, ex = make_engine(max_num_batched_tokens=64, max_num_seqs=4)
    eng.scheduler.policy = eng.scheduler.waiting.policy = Capped()
    eng.add_request(list(range(1, 41)), SamplingParams(max_tokens=2), request_id="r")
    eng.step()   # admitted: its first chunk (the waiting path caps too)
    calls.clear()
    eng.step()   # running: the partial prefill's next chunk
    assert calls == ["r"] and [sr.num_tokens for sr in ex.steps[-1].scheduled] == [8]


costs = st.builds(ServiceCosts, st.floats(0, 4), st.floats(0, 1), st.floats(0, 4))
rows = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 300), st.booleans(),
                          st.sampled_from([0, 0, 16, 130]), st.booleans()), max_size=40)


@settings(max_examples=200, deadline=None)
@given(costs=costs, weights=st.dictionaries(st.sampled_from(["a", "b"]), st.floats(0.1, 8)), rows=rows)
def test_a_rows_charge_adds_exactly_what_charge_adds(costs, weights, rows):
    """The scheduler's `charge_row` (and `charge_decode`) against the long form it replaced."""
    fast, slow = ServiceLedger(costs, weights), ServiceLedger(costs, weights)
    for tenant, n, prefill, cached, via_decode in rows:
        long_form = slow.charge(tenant, n if prefill else 0, cached, 0 if prefill else n)
        if via_decode and not prefill and not cached:
            assert fast.charge_decode(tenant, n) == long_form
        else:
            assert fast.charge_row(tenant, n, prefill, cached) == long_form
    for t in ("a", "b"):   # bit for bit, not approximately
        assert fast.service(t).hex() == slow.service(t).hex()
        assert fast.normalized(t).hex() == slow.normalized(t).hex()


def test_the_scheduler_ledger_charges_decode_rows():
    eng, ex = make_engine()
    eng.add_request(list(range(1, 30)), SamplingParams(max_tokens=5, ignore_eos=True))
    run(eng, ex)
    # 29 prompt tokens computed at 1.0, 5 outputs of which 4 decode steps at 2.0 (the first comes with the prefill)
    assert eng.scheduler.ledger.service("default") == 29 * 1.0 + 4 * 2.0


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, 9), max_size=20), output=st.lists(st.integers(0, 9), max_size=20),
       data=st.data())
def test_token_prefix_reads_as_the_copied_list(prompt, output, data):
    """`TokenPrefix` (what the KV manager hands the prefix cache instead of a copy) indexes and
    slices exactly as the list `token_ids_slice(0, n)` would build."""
    n = data.draw(st.integers(0, len(prompt) + len(output)))
    view, copy = TokenPrefix(prompt, output, n), (prompt + output)[:n]
    assert len(view) == len(copy) and list(view) == copy
    start, stop = data.draw(st.integers(-25, 25)), data.draw(st.integers(-25, 25) | st.none())
    step = data.draw(st.sampled_from([None, 1, 2, -1]))
    assert view[start:stop:step] == copy[start:stop:step]
    if copy:
        i = data.draw(st.integers(-len(copy), len(copy) - 1))
        assert view[i] == copy[i]
