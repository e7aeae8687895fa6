"""Tokenizer and IncrementalDetokenizer on SmolLM2's GGUF tokenizer (built from metadata, then cached)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pacer.model.loader import default_model_path
from pacer.model.tokenizer import IncrementalDetokenizer, Tokenizer, gguf_cache_stem

SAMPLES = [
    "Hello, world!", " The quick brown fox jumps over the lazy dog.", "\n\n", "  indented\tcode()",
    "I'm sure they'll've done it.", " 3.14159 and 1,000,000 ", "emoji 😀🎉👍🏽 ", "👨‍👩‍👧‍👦",
    "你好，世界。", "こんにちは", "한국어 텍스트", "Ελληνικά ", "ñandú façade naïve", "∑ x² ≤ ∞",
    "def f(x):\n    return x ** 2\n", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gguf-cache"))


@pytest.fixture(scope="module")
def tok(cache_dir: str) -> Tokenizer:
    t = Tokenizer.load(default_model_path(), cache_dir=cache_dir)
    assert t is not None
    return t


def test_gguf_tokenizer_properties(tok: Tokenizer) -> None:
    assert tok.bos_token_id == 1 and tok.eos_token_id == 2
    assert tok.vocab_size == 49152
    assert set(range(17)) <= set(tok.all_special_ids)  # the control tokens <|endoftext|> .. <empty_output>
    assert tok.encode("Hello world") == [19556, 905]  # no BOS: SmolLM2 does not add one


@pytest.mark.parametrize("text", SAMPLES + ["".join(SAMPLES)])
def test_encode_decode_round_trip(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):  # kept whole, skipped on request
        text = text.replace(special, "")
    assert tok.decode(ids) == text


def test_token_bytes_spell_split_characters(tok: Tokenizer) -> None:
    ids = tok.encode("Héllo — 日本語 🙂<|im_end|>")
    pieces = [tok.token_bytes(i) for i in ids]
    assert b"".join(pieces).decode() == tok.decode(ids, skip_special_tokens=False)
    assert any(p and tok.decode([i]) == "\ufffd" for i, p in zip(ids, pieces))   # a character split over tokens


def test_special_tokens_are_single_ids(tok: Tokenizer) -> None:
    assert tok.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]


def test_chat_template(tok: Tokenizer) -> None:
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    text = tok.decode(ids, skip_special_tokens=False)
    assert "<|im_start|>user\nWhat is 2+2?<|im_end|>\n" in text
    assert text.startswith("<|im_start|>system\n")  # SmolLM2's template adds a default system prompt
    assert text.endswith("<|im_start|>assistant\n")
    assert ids.count(1) == 3 and ids.count(2) == 2
    no_prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert not tok.decode(no_prompt, skip_special_tokens=False).endswith("assistant\n")


def test_missing_chat_template_is_a_clear_error(tok: Tokenizer) -> None:
    hf = copy.deepcopy(tok.hf)
    hf.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(hf).apply_chat_template([{"role": "user", "content": "hi"}])


def test_cached_tokenizer_matches_fresh_build(tok: Tokenizer, cache_dir: str) -> None:
    stem = gguf_cache_stem(default_model_path(), cache_dir)
    assert (Path(f"{stem}.tokenizer") / "tokenizer.json").is_file()
    again = Tokenizer.load(default_model_path(), cache_dir=cache_dir)
    assert again is not None
    text = "".join(SAMPLES)
    assert again.encode(text) == tok.encode(text)
    messages = [{"role": "user", "content": "hi"}]
    assert again.apply_chat_template(messages) == tok.apply_chat_template(messages)
    assert (again.bos_token_id, again.eos_token_id, again.all_special_ids) == (1, 2, tok.all_special_ids)


def test_hf_directory_tokenizer(tok: Tokenizer, tmp_path: Path) -> None:
    assert Tokenizer.load(str(tmp_path)) is None  # a directory without tokenizer files
    tok.hf.save_pretrained(str(tmp_path))
    loaded = Tokenizer.load(str(tmp_path))
    assert loaded is not None
    assert loaded.encode("".join(SAMPLES)) == tok.encode("".join(SAMPLES))


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        Tokenizer.load(str(tmp_path / "nope.gguf"))


@pytest.mark.slow
def test_matches_transformers_gguf_tokenizer(tok: Tokenizer) -> None:
    from transformers import AutoTokenizer

    path = Path(default_model_path())
    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = "".join(SAMPLES) + " 12345 x1y22z333 " + "a" * 40
    assert tok.encode(text) == ref.encode(text)
    messages = [{"role": "user", "content": "hi"}]
    rendered = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(messages) == ref.encode(rendered, add_special_tokens=False)


# ---------------------------------------------------------------- incremental detokenization


def _stream(tok: Tokenizer, ids: list[int], cuts: list[int], skip: bool) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    bounds = [0, *sorted({c % (len(ids) + 1) for c in cuts}), len(ids)]
    pieces = [detok.push(ids[a:b]) for a, b in zip(bounds, bounds[1:])]
    return pieces, detok


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(st.sampled_from(SAMPLES), min_size=1, max_size=12),
       cuts=st.lists(st.integers(0, 10_000), max_size=20), skip=st.booleans())
def test_incremental_detokenizer_matches_decode(tok: Tokenizer, parts: list[str], cuts: list[int], skip: bool) -> None:
    ids = tok.encode("".join(parts))
    pieces, detok = _stream(tok, ids, cuts, skip)
    expected = tok.decode(ids, skip_special_tokens=skip)
    assert "".join(pieces) == expected == detok.text
    assert detok.flush() == ""  # real text ends on a whole character: nothing held back


@settings(max_examples=150, deadline=None)
@given(ids=st.lists(st.one_of(st.integers(0, 49151), st.integers(0, 300)), max_size=40),
       cuts=st.lists(st.integers(0, 10_000), max_size=20), skip=st.booleans())
def test_incremental_detokenizer_on_arbitrary_ids(tok: Tokenizer, ids: list[int], cuts: list[int], skip: bool) -> None:
    # low ids are single bytes, so this makes split and invalid UTF-8; flush() releases the tail
    pieces, detok = _stream(tok, ids, cuts, skip)
    tail = detok.flush()
    assert "".join(pieces) + tail == tok.decode(ids, skip_special_tokens=skip) == detok.text


def test_incremental_detokenizer_holds_back_split_characters(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1  # the emoji's four bytes span tokens
    detok = IncrementalDetokenizer(tok)
    assert [detok.push([i]) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1:]) == "😀"


def test_incremental_detokenizer_decodes_a_bounded_window(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = tok.encode(" ".join(SAMPLES) * 20)
    widths: list[int] = []
    decode = tok.decode

    def spy(window: list[int], skip_special_tokens: bool = True) -> str:
        widths.append(len(window))
        return decode(window, skip_special_tokens=skip_special_tokens)

    monkeypatch.setattr(tok, "decode", spy)
    detok = IncrementalDetokenizer(tok)
    for i in ids:
        detok.push([i])
    monkeypatch.undo()
    assert detok.text == tok.decode(ids)
    assert len(ids) > 1000 and max(widths) <= 12  # O(new tokens), not O(all tokens)
