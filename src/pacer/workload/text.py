"""Prompt text for `pacer bench` workloads: real English sentences cut to exact token counts.

This room owns the corpus and turns "N tokens of text" into token ids plus the text they
decode to. It touches only a tokenizer given to it (anything with `encode`/`decode`); without
one, `WordTokenizer` stands in (one token per word, stable ids), which is enough for the
simulator, which needs token ids for prefix sharing but never detokenizes for real.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pacer.corpus import CORPUS

__all__ = ["TokenizerLike", "WordTokenizer", "Segment", "TextSource", "CORPUS"]


class TokenizerLike(Protocol):
    """The part of a tokenizer the workload generator needs (pacer's `Tokenizer` fits)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class WordTokenizer:
    """A stand-in tokenizer: each whitespace-separated word (with its leading space) is one
    token; ids are a stable hash of the word, so equal text gives equal ids across runs."""

    def __init__(self, vocab_size: int = 32_000) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self.vocab_size = vocab_size
        self._words: dict[int, str] = {}

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for word in text.split():
            digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
            tid = int.from_bytes(digest, "little") % self.vocab_size
            self._words.setdefault(tid, word)
            ids.append(tid)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(" " + self._words.get(i, f"<{i}>") for i in ids)




@dataclass(frozen=True, slots=True)
class Segment:
    """A run of prompt text and its exact token ids under the tokenizer that made it."""

    token_ids: tuple[int, ...]
    text: str

    def __len__(self) -> int:
        return len(self.token_ids)


class TextSource:
    """Makes text of exactly `n` tokens: seeded shuffles of `CORPUS`, each sentence encoded once.

    Token ids are the concatenation of per-sentence ids (each sentence encoded with its leading
    space), cut to `n`; the text is their decoding. Re-encoding that text gives the same ids
    except, rarely, at the cut, so servers that tokenize text see `n` tokens give or take one.
    """

    def __init__(self, tokenizer: TokenizerLike | None = None) -> None:
        self.tokenizer: TokenizerLike = tokenizer if tokenizer is not None else WordTokenizer()
        bos = getattr(self.tokenizer, "bos_token_id", None)
        self._sentences: list[tuple[int, ...]] = []
        for sentence in CORPUS:
            ids = list(self.tokenizer.encode(" " + sentence))
            if ids and bos is not None and ids[0] == bos:
                ids = ids[1:]   # a tokenizer that adds BOS must not add it inside a prompt
            self._sentences.append(tuple(ids))

    def segment(self, num_tokens: int, rng: random.Random) -> Segment:
        """`num_tokens` tokens of text (0 gives an empty segment)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        ids: list[int] = []
        order: list[int] = []
        while len(ids) < num_tokens:
            if not order:
                order = list(range(len(self._sentences)))
                rng.shuffle(order)
            ids.extend(self._sentences[order.pop()])
        del ids[num_tokens:]
        return Segment(tuple(ids), self.tokenizer.decode(ids) if ids else "")
