"""Workload generation: determinism, lengths, sessions sharing prefixes, arrivals, traces."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from pacer.workload.arrivals import ClosedLoop, Gamma, Poisson, arrival_times, make_arrivals
from pacer.workload.generator import generate_requests, iter_requests
from pacer.workload.spec import LengthDist, builtin_workload, load_workload
from pacer.workload.text import TextSource, WordTokenizer
from pacer.workload.trace import load_trace


def test_same_seed_same_requests_and_different_seed_differs() -> None:
    wl = builtin_workload("mixed")
    a = generate_requests(wl, Poisson(5), seed=3, num_requests=40, max_model_len=2048)
    b = generate_requests(wl, Poisson(5), seed=3, num_requests=40, max_model_len=2048)
    c = generate_requests(wl, Poisson(5), seed=4, num_requests=40, max_model_len=2048)
    assert a == b
    assert [s.prompt_token_ids for s in a] != [s.prompt_token_ids for s in c]


def test_fixed_workload_is_exact() -> None:
    specs = generate_requests(builtin_workload("fixed", 100, 7), ClosedLoop(2), num_requests=5)
    assert all(s.prompt_tokens == 100 and s.output_tokens == 7 and s.ignore_eos for s in specs)
    assert all(s.arrival_time is None for s in specs)
    assert len({s.prompt_token_ids for s in specs}) == 5   # no accidental shared prefixes


def test_length_dist_mean_and_cv() -> None:
    rng = random.Random(0)
    for cv in (0.1, 1.5):
        xs = [LengthDist(500, cv, min=1).sample(rng) for _ in range(20_000)]
        assert statistics.fmean(xs) == pytest.approx(500, rel=0.05)
        assert statistics.pstdev(xs) / statistics.fmean(xs) == pytest.approx(cv, rel=0.1)
    assert {LengthDist(10, 0).sample(rng) for _ in range(10)} == {10}
    assert max(LengthDist(100, 2.0, max=150).sample(rng) for _ in range(1000)) <= 150


def test_sessions_extend_their_previous_prompt() -> None:
    specs = generate_requests(builtin_workload("agent"), Poisson(10), seed=1, num_requests=60)
    by_session: dict[str, list[tuple[int, ...]]] = {}
    for s in specs:
        assert s.session is not None
        by_session.setdefault(s.session, []).append(s.prompt_token_ids)
    multi = [turns for turns in by_session.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        for prev, cur in zip(turns, turns[1:]):
            assert cur[: len(prev)] == prev and len(cur) > len(prev)
    # the tool-definition prefix is shared by every agent request
    first = specs[0].prompt_token_ids[:1024]
    assert all(s.prompt_token_ids[:1024] == first for s in specs)


def test_max_model_len_is_respected() -> None:
    specs = generate_requests(builtin_workload("mixed"), Poisson(10), seed=2, num_requests=200, max_model_len=1200)
    assert all(s.prompt_tokens + s.output_tokens <= 1200 for s in specs)


def test_text_has_exact_token_count_with_real_tokenizer_shape() -> None:
    src = TextSource(WordTokenizer())
    seg = src.segment(37, random.Random(0))
    assert len(seg) == 37 and len(src.tokenizer.encode(seg.text)) == 37


def test_arrivals_rate_burstiness_and_duration() -> None:
    times = list(arrival_times(Poisson(20), seed=0, num_requests=4000))
    assert times[0] == 0.0 and times == sorted(times)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.fmean(gaps) == pytest.approx(1 / 20, rel=0.06)
    bursty = list(arrival_times(Gamma(20, 0.25), seed=0, num_requests=4000))
    bgaps = [b - a for a, b in zip(bursty, bursty[1:])]
    assert statistics.pstdev(bgaps) / statistics.fmean(bgaps) == pytest.approx(2.0, rel=0.15)
    assert all(t <= 2.0 for t in arrival_times(Poisson(50), seed=0, duration=2.0))
    assert set(arrival_times(Poisson(math.inf), seed=0, num_requests=3)) == {0.0}
    assert isinstance(make_arrivals(None, concurrency=4), ClosedLoop)
    with pytest.raises(ValueError, match="request-rate"):
        make_arrivals(None)


def test_closed_loop_with_duration_is_lazy() -> None:
    it = iter_requests(builtin_workload("chat"), ClosedLoop(4), duration=5.0)
    assert [next(it).request_id for _ in range(3)] == ["req-0", "req-1", "req-2"]
    with pytest.raises(ValueError, match="endless"):
        generate_requests(builtin_workload("chat"), ClosedLoop(4), duration=5.0)


def test_workload_from_yaml_with_base_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "wl.yaml"
    p.write_text("classes:\n  - {base: chat, weight: 3, prompt_len: {mean: 50, cv: 1.5}}\n"
                 "  - {name: long, prompt_len: 900, output_len: {mean: 20}, priority: 2}\n")
    wl = load_workload(str(p))
    assert [c.name for c in wl.classes] == ["chat", "long"]
    assert wl.classes[0].prompt_len == LengthDist(50, 1.5) and wl.classes[0].shared_prefix_len == 64
    specs = generate_requests(wl, Poisson(10), num_requests=50)
    assert {s.request_class for s in specs} == {"chat", "long"}
    assert all(s.priority == 2 for s in specs if s.request_class == "long")
    p.write_text("classes:\n  - {base: chat, prompt_length: 5}\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_workload(str(p))
    with pytest.raises(ValueError, match="unknown workload"):
        load_workload("nope")


def test_trace_replay_from_lengths_and_text(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000.5, "prompt_tokens": 40, "output_tokens": 8, "class": "chat", "session": "s1"},
        {"timestamp": 1000.0, "prompt": "Hello there, how are you?", "output_tokens": 4, "tenant": "t2"},
        {"timestamp": 1002.0, "prompt_tokens": 70, "output_tokens": 5, "class": "chat", "session": "s1",
         "priority": 1},
    ]
    p = tmp_path / "trace.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    specs = load_trace(p)
    assert [s.arrival_time for s in specs] == [0.0, 0.5, 2.0]
    assert specs[0].tenant == "t2" and specs[0].request_class == "trace"
    assert specs[1].prompt_tokens == 40 and specs[2].prompt_tokens == 70 and specs[2].priority == 1
    assert specs[2].prompt_token_ids[:40] == specs[1].prompt_token_ids   # same session: shared prefix
    p.write_text('{"prompt_tokens": 3}\n')
    with pytest.raises(ValueError, match="timestamp"):
        load_trace(p)


def test_prompts_are_exact_under_the_default_models_tokenizer() -> None:
    from pacer.model.loader import default_model_path
    from pacer.model.tokenizer import Tokenizer

    try:
        tok = Tokenizer.load(default_model_path())
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert tok is not None
    specs = generate_requests(builtin_workload("mixed"), Poisson(5), seed=0, num_requests=60, tokenizer=tok,
                              max_model_len=2048)
    for s in specs:
        assert tuple(tok.encode(s.prompt)) == s.prompt_token_ids   # the text re-encodes to the same tokens
    fixed = generate_requests(builtin_workload("fixed", 333, 4), Poisson(5), num_requests=3, tokenizer=tok)
    assert [len(tok.encode(s.prompt)) for s in fixed] == [333] * 3
    chat = next(s for s in specs if s.request_class == "chat" and s.turn > 0)
    assert [m.role for m in chat.messages][:3] == ["system", "user", "assistant"]
    assert len(tok.apply_chat_template([m.as_dict() for m in chat.messages])) > chat.prompt_tokens
