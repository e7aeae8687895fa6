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


# Original sentences on everyday and technical topics; prompts are seeded shuffles of them, so
# no two requests share a prefix unless the workload says so (system prompt, history).
CORPUS: tuple[str, ...] = (
    "The harbour was quiet before dawn, and the fishing boats rocked gently against their ropes.",
    "A good cup of coffee depends less on the machine than on fresh beans and clean water.",
    "The committee postponed its decision until the engineers could explain the budget overrun.",
    "Most gardeners learn the hard way that tomatoes need more sun than the label suggests.",
    "When the train stopped between stations, the passengers looked up from their phones at once.",
    "Databases keep a write-ahead log so that a crash in the middle of a transaction loses nothing.",
    "She kept a notebook of every bird she saw, with the date, the weather and a rough sketch.",
    "The museum's new wing holds maps drawn by sailors who never saw the coasts they described.",
    "A cache only helps when the same data is asked for again before it is pushed out.",
    "In the mountains the weather can change within an hour, so hikers carry a warm layer.",
    "The recipe calls for two onions, a handful of lentils and a spoonful of cumin seeds.",
    "Compilers turn loops into vector instructions when they can prove the iterations are independent.",
    "The old bridge was closed to trucks after inspectors found rust in its main cables.",
    "Children remember stories better when they can guess what happens on the next page.",
    "A queue that grows faster than it drains will eventually hold every request that arrives.",
    "The violinist tuned her instrument twice, because the hall was colder than the green room.",
    "Electric buses charge at the depot overnight and top up at the end of each route.",
    "The report lists three causes of the outage, but the timeline suggests a fourth.",
    "Bread rises because yeast turns sugar into gas, which the gluten traps in small bubbles.",
    "The city library lends tools as well as books, from drills to sewing machines.",
    "Latency that looks fine on average can still hide a slow tail that users notice.",
    "The volunteers counted the frogs crossing the road on rainy nights in early spring.",
    "A map is useful precisely because it leaves out most of what is on the ground.",
    "The startup rewrote its billing system after a rounding error charged some users twice.",
    "On clear nights the observatory opens its roof and lets visitors look at Saturn's rings.",
    "Farmers rotate their crops so that the soil does not lose the same nutrients every year.",
    "The translator asked for more context, since the word could mean either promise or threat.",
    "Every additional reviewer found a different bug, which said something about the code.",
    "The ferry schedule changes in winter, when fewer tourists cross to the island.",
    "A thermostat that reacts too quickly makes the heating switch on and off all day.",
    "The historian argued that the treaty failed because nobody had planned how to enforce it.",
    "Good documentation answers the question the reader has, not the one the author finds interesting.",
    "The cyclists left early to avoid the afternoon heat on the long climb to the pass.",
    "Sorting the requests by length first made the whole batch finish noticeably sooner.",
    "The bakery sells the day's leftover loaves at half price just before it closes.",
    "A river changes its course slowly, then all at once during a single flood.",
    "The spreadsheet had grown so large that opening it took longer than the meeting.",
    "Her grandmother's letters described a village that no longer appears on any map.",
    "Network packets can arrive out of order, so the receiver numbers and reassembles them.",
    "The orchestra rehearsed the slow movement until the strings breathed together.",
    "Wind turbines turn to face the wind, and stop entirely when gusts become dangerous.",
    "The detective noticed that the clock on the mantel was running exactly ten minutes fast.",
    "A short meeting with a clear agenda is worth more than an afternoon of discussion.",
    "The glacier has retreated almost a kilometre since the first photographs were taken.",
    "Students who explain a problem aloud often find the mistake before anyone answers.",
    "The warehouse robots follow painted lines on the floor and pause when someone walks by.",
    "Tea leaves unfurl slowly in hot water, releasing flavour over several minutes.",
    "The new policy lets urgent requests jump the queue, as long as they stay rare.",
    "Old houses settle over the decades, which is why their doors rarely close cleanly.",
    "The team measured before tuning, and found the bottleneck was not where they expected.",
    "A lighthouse keeper once had to wind the lamp's clockwork every few hours through the night.",
    "The market opens at six, and the best fruit is gone by eight.",
    "Memory that is allocated in fixed pages can be shared without copying whole buffers.",
    "The novel follows two sisters who inherit a vineyard neither of them wants.",
    "Snow muffles sound so well that a city street can feel as quiet as a forest.",
    "The pilot announced a short delay while the ground crew de-iced the wings.",
    "A fair scheduler makes sure that no one waits forever, even when others are more urgent.",
    "The potter trimmed the bowl on the wheel once the clay had dried to the feel of leather.",
    "Public parks cool the neighbourhoods around them on the hottest summer days.",
    "The engineer drew the system on a whiteboard and the problem became obvious to everyone.",
    "Honey never really spoils, although it may crystallise if the kitchen is cold.",
    "The election results arrived district by district, and the lead changed twice.",
    "An index speeds up reads but makes every write a little more expensive.",
    "The choir sang in the cathedral, where each note lingered for several seconds.",
    "Satellites in low orbit circle the planet in about an hour and a half.",
    "The chef tasted the soup, added a pinch of salt, and tasted it again.",
    "Throughput and latency pull in different directions once the batch grows large enough.",
    "The hikers followed the cairns across the plateau when the fog came down.",
    "A tidy workshop saves time, because every tool is where the hand expects it.",
    "The archive digitised its photographs so that researchers abroad could study them.",
    "Long prompts take longer to read, and everything queued behind them waits as well.",
    "The festival ended with fireworks over the lake and a long walk home.",
)


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
