"""The grammar manager on the real tokenizer, without the model: compiles on worker
processes, cached by content; a compile past the timeout fails alone and its worker process
is killed; masks allow exactly what the grammar allows."""

from __future__ import annotations

import os

import pytest
import torch

from pacer.model.loader import default_model_path
from pacer.model.tokenizer import Tokenizer
from pacer.request import StructuredOutputsParams
from pacer.structured.manager import StructuredOutputError, StructuredOutputManager

SLOW = "tests.structured.slow_compiler:compile_spec"


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.load(default_model_path())


def _manager(tokenizer, **kw):
    return StructuredOutputManager(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id], num_workers=1, **kw)


def test_compiles_once_per_content(tokenizer):
    m = _manager(tokenizer)
    try:
        a = StructuredOutputsParams(json={"type": "object", "properties": {"x": {"type": "integer"}}})
        b = StructuredOutputsParams(json='{"properties": {"x": {"type": "integer"}}, "type": "object"}')
        first = m.request(a).result(60)
        assert m.request(b).result(60) is first          # same content (key order aside): a cache hit
        m.request(StructuredOutputsParams(regex=r"\d+")).result(60)
        st = m.stats.as_dict()
        assert st["compilations"] == 2 and st["cache_hits"] == 1 and st["errors"] == 0
        with pytest.raises(StructuredOutputError, match="regex"):
            m.request(StructuredOutputsParams(regex="[a-")).result(60)
        assert m.stats.errors == 1
    finally:
        m.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_timeout_kills_the_worker_and_fails_only_that_grammar(tokenizer):
    m = _manager(tokenizer, timeout=1.0, compiler=SLOW)
    try:
        m.request(StructuredOutputsParams(choice=["warm"])).result(60)   # the worker is up
        pid = m.all_workers[0].pid
        slow = m.request(StructuredOutputsParams(json={"title": "slow", "type": "object"}))
        with pytest.raises(StructuredOutputError, match="did not compile within 1 s") as e:
            slow.result(60)
        assert e.value.timed_out and m.stats.timeouts == 1
        assert not _alive(pid), "the timed-out compile's process must be gone"
        ok = m.request(StructuredOutputsParams(choice=["after"])).result(60)   # a fresh worker
        assert ok.grammar and m.all_workers[0].num_starts == 2
    finally:
        m.close()


def test_masks_allow_only_grammar_tokens(tokenizer):
    m = _manager(tokenizer)
    try:
        compiled = m.request(StructuredOutputsParams(choice=["alpha", "beta"])).result(60)
        m.bind("r", compiled)
        masks = m.start_masks(["other", "r"])
        logits = torch.randn(2, tokenizer.vocab_size + 64)   # logits wider than the tokenizer
        original = logits.clone()
        masked = masks.apply(logits, ["other", "r"])         # in place
        assert masked is logits and torch.equal(masked[0], original[0])   # unconstrained rows are untouched
        assert torch.equal(masked[1][torch.isfinite(masked[1])], original[1][torch.isfinite(masked[1])])
        allowed = torch.isfinite(masked[1]).nonzero().flatten().tolist()
        assert allowed and all(any(w.startswith(tokenizer.decode([t])) for w in ("alpha", "beta")) for t in allowed)
        assert max(allowed) < tokenizer.vocab_size
        text = ""
        while True:
            masks = m.start_masks(["r"])
            tok = int(masks.apply(torch.randn(1, tokenizer.vocab_size), ["r"]).argmax())
            text += tokenizer.decode([tok])
            if m.accept("r", tok):
                break
        assert text in ("alpha", "beta")
        assert m.stats.mask_rows >= 2 and m.stats.mask_compute_seconds > 0
    finally:
        m.close()


def test_masks_follow_their_request_in_any_row_order(tokenizer):
    m = _manager(tokenizer)
    try:
        m.bind("a", m.request(StructuredOutputsParams(choice=["alpha", "beta"])).result(60))
        m.bind("b", m.request(StructuredOutputsParams(regex=r"[0-9]{3}")).result(60))

        def allowed(ids, order):
            logits = m.start_masks(ids).apply(torch.zeros(len(order), tokenizer.vocab_size), order)
            return [frozenset(torch.isfinite(row).nonzero().flatten().tolist()) for row in logits]

        alone_a, alone_b = allowed(["a"], ["a"])[0], allowed(["b"], ["b"])[0]
        assert alone_a and alone_b and alone_a != alone_b
        assert allowed(["a", "b"], ["b", "x", "a"]) == [alone_b, frozenset(range(tokenizer.vocab_size)), alone_a]
        assert allowed(["a", "b"], ["b"]) == [alone_b]
    finally:
        m.close()


def test_bitmask_kernel_and_the_bias_fallback_mask_alike(tokenizer):
    from pacer.model import kernels
    from pacer.structured.masks import _apply_bias

    if kernels.load() is None:
        pytest.skip("the C++ kernels are not built here")
    m = _manager(tokenizer)
    try:
        m.bind("a", m.request(StructuredOutputsParams(json={"type": "object"})).result(60))
        m.bind("b", m.request(StructuredOutputsParams(regex=r"[a-c]+")).result(60))
        masks = m.start_masks(["a", "b"])
        logits = torch.randn(3, tokenizer.vocab_size + 64)
        fallback = logits.clone()
        masks.apply(logits, ["b", "x", "a"])   # the kernel
        _apply_bias(fallback, masks.bitmask(), torch.tensor([0, 2]), torch.tensor([1, 0]))
        assert torch.equal(logits, fallback)
        assert 0 < int(torch.isfinite(logits[0]).sum()) < tokenizer.vocab_size
        assert not torch.isfinite(logits[0, tokenizer.vocab_size:]).any()
    finally:
        m.close()


def test_structural_tag_is_free_text_until_the_trigger(tokenizer):
    """Free text passes; after the trigger only the tag's begin, a schema-valid object and its
    end do; then free text again."""
    import llguidance as llg

    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    tag = {"structures": [{"begin": "<function=get_weather>", "schema": schema, "end": "</function>"}],
           "triggers": ["<function="]}
    m = _manager(tokenizer)
    try:
        compiled = m.request(StructuredOutputsParams(structural_tag=tag)).result(60)
    finally:
        m.close()

    def feed(text):
        matcher = compiled.prototype.deep_copy()
        return all(matcher.consume_token(t) for t in tokenizer.hf.encode(text, add_special_tokens=False))

    assert isinstance(compiled.prototype, llg.LLMatcher)
    assert feed('Sure. <function=get_weather>{"city":"Paris"}</function> and more text')
    assert not feed("Sure. <function=get_time>")
    assert not feed('<function=get_weather>{"town":"Paris"}')


def test_a_closed_manager_starts_no_worker_after_its_tokenizer_file_is_gone(tokenizer):
    """close() may run while a warm-up thread is starting a worker: once closed, a worker refuses
    to start (it would read a tokenizer file close removed) instead of spawning a process."""
    from pacer.structured.worker import WorkerFailed

    m = _manager(tokenizer)
    worker = m.all_workers[0]
    m.close()
    assert worker.closed and worker.proc is None
    starts = worker.num_starts
    with pytest.raises(WorkerFailed, match="closed"):
        worker.ensure_started()
    assert worker.num_starts == starts and worker.proc is None
