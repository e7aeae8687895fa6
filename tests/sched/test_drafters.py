"""Draft proposers: n-gram prompt lookup and suffix decoding over a tenant's recent outputs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.sched.drafters import NgramDrafter, NgramIndex, SuffixDrafter


def naive_propose(tokens: list[int], n_min: int, n_max: int, k: int) -> list[int]:
    """Longest suffix n-gram, its latest earlier occurrence, the tokens after it."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for end in range(len(tokens) - 1, n - 1, -1):
            if tokens[end - n:end] == suffix:
                seq = list(tokens)
                while len(seq) < len(tokens) + k and end + len(seq) - len(tokens) < len(seq):
                    seq.append(seq[end + len(seq) - len(tokens)])
                return seq[len(tokens):] if end + k > len(tokens) else tokens[end:end + k]
    return []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40), st.integers(1, 3), st.integers(0, 2),
       st.integers(1, 5), st.integers(0, 40))
def test_incremental_index_matches_a_scan(tokens, n_min, extra, k, split):
    """Proposals after growing the index step by step equal a full scan of the context."""
    n_max = n_min + extra
    d = NgramDrafter(n_min, n_max)
    prompt = tokens[:max(1, min(split, len(tokens)))]
    output = tokens[len(prompt):]
    for i in range(len(output) + 1):   # the request grows one token per step
        got = d.propose("r", "t", prompt, output[:i], k)
        assert got == naive_propose(prompt + output[:i], n_min, n_max, k)


def test_suffix_drafts_from_the_tenants_earlier_outputs():
    d = SuffixDrafter(1, 3)
    agent_step = [50, 51, 52, 53, 54, 55]
    d.finish("a", "team", agent_step)
    assert d.propose("b", "team", [1, 2, 50, 51], [], 4) == [52, 53, 54, 55]
    assert d.propose("c", "other", [1, 2, 50, 51], [], 4) == []     # another tenant sees nothing
    # the request's own match wins a tie; a longer shared match wins over a shorter own one
    assert d.propose("e", "team", [9, 51, 7, 9, 51], [], 2) == [7, 9]
    assert d.propose("f", "team", [51, 7, 50, 51], [], 2) == [52, 53]


def test_suffix_window_is_bounded_and_stops_at_an_outputs_end():
    d = SuffixDrafter(1, 2, max_cached_requests=2)
    d.finish("a", "t", [1, 2, 3])
    d.finish("b", "t", [4, 5])
    assert d.propose("x", "t", [9, 2], [], 4) == [3]          # not past the end of output "a"
    d.finish("c", "t", [6, 7])                                 # "a" falls out of the window
    assert d.propose("y", "t", [9, 2], [], 4) == []
    assert d.propose("z", "t", [9, 6], [], 4) == [7]


def test_index_latest_occurrence():
    idx = NgramIndex(2, 2)
    idx.extend([1, 2, 3, 1, 2, 4, 1, 2])
    assert idx.match([1, 2]) == (2, 5)
    assert idx.continuation(5, 3) == [4, 1, 2]
    assert idx.continuation(7, 4) == [2, 2, 2, 2]   # past the end the match copies on
