"""PrefixHomes keeps its traffic figure equal to its definition (each prefix's decisions in the
window, split evenly over its homes) under any sequence of decisions and re-homings."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.deploy.prefix_homes import PrefixHomes

REPLICAS = ("r0", "r1", "r2")
ops = st.lists(st.one_of(
    st.tuples(st.just("record"), st.integers(0, 5)),
    st.tuples(st.just("home"), st.integers(0, 5), st.sets(st.sampled_from(REPLICAS), min_size=1)),
), max_size=120)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(1, 12))
def test_traffic_is_each_prefixs_window_share_over_its_homes(steps, window):
    h = PrefixHomes()
    used: set[int] = set()               # prefixes recorded since they last got homes
    for op in steps:
        if op[0] == "record":
            h.record(op[1], window)
            used.add(op[1])
        else:
            used.discard(op[1])
            h.set_homes(op[1], tuple(sorted(op[2])))
        assert len(h.window) <= window
        assert h.freq == Counter(h.window)
        for r in REPLICAS:
            expected = sum(c / len(h.homes(p)) for p, c in h.freq.items() if r in h.homes(p))
            assert abs(h.traffic[r] - expected) < 1e-9
        for p in used:                     # a prefix whose decisions all left the window is forgotten
            if p not in h.window:
                assert h.homes(p) == ()
