"""Draft-model-free proposers: n-gram prompt lookup and suffix decoding. Pure Python.

Both look up the request's last n tokens (n from `prompt_lookup_max` down to
`prompt_lookup_min`) among earlier n-grams and propose the tokens that followed the most
recent earlier occurrence (continuing the copy past the end when the match overlaps it).
`NgramIndex` keeps, per n, "n-gram -> latest end position" over a
token sequence and is extended incrementally as the request grows, so a proposal costs
O(n range) dict look-ups, not a scan of the context.

- `ngram` (vLLM's prompt lookup): the request's own prompt and output.
- `suffix` (suffix decoding): the same, plus the recent outputs of other requests of the same
  tenant (a bounded window per tenant, for at most `max_tenants` tenants, the least recently
  used dropped first: tenants may be client-named), which pays on repeated agent loops; the
  longest match wins, the request's own on a tie.

Drafters never touch scheduler state: the caller hands them a request's tokens
(`Request.token_ids_slice`) and tells them when a request finishes.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Protocol

__all__ = ["NgramIndex", "Drafter", "NgramDrafter", "SuffixDrafter", "make_drafter"]


class NgramIndex:
    """n-gram (n in [n_min, n_max]) -> the latest end position e with tokens[e-n:e] == it
    and at least one token after it (e < len)."""

    __slots__ = ("n_min", "n_max", "tokens", "_latest", "_indexed_to")

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}
        self._indexed_to = 0   # ends < this are indexed

    def extend(self, new_tokens: Sequence[int]) -> None:
        self.tokens.extend(new_tokens)
        toks = self.tokens
        for end in range(max(self._indexed_to, self.n_min), len(toks)):   # ends with a continuation
            for n in range(self.n_min, min(self.n_max, end) + 1):
                self._latest[tuple(toks[end - n:end])] = end
        self._indexed_to = max(self._indexed_to, len(toks))

    def match(self, suffix: Sequence[int]) -> tuple[int, int]:
        """(n, end) of the longest n-gram ending `suffix` seen earlier here; (0, 0) if none."""
        for n in range(min(self.n_max, len(suffix)), self.n_min - 1, -1):
            end = self._latest.get(tuple(suffix[len(suffix) - n:]))
            if end is not None:
                return n, end
        return 0, 0

    def continuation(self, end: int, k: int) -> list[int]:
        """The k tokens after position `end`; past the sequence's end the match repeats
        itself (a run or a period copies on), so a draft is not cut short by overlap."""
        toks = self.tokens
        draft = toks[end:end + k]
        length = len(toks)
        while len(draft) < k and end < length:
            draft.append(draft[end + len(draft) - length])
        return draft


class Drafter(Protocol):
    def propose(self, request_id: str, tenant: str, prompt: Sequence[int], output: Sequence[int],
                k: int) -> list[int]:
        """Up to k draft tokens to follow the request's prompt + output so far."""
        ...

    def finish(self, request_id: str, tenant: str, output_token_ids: Sequence[int]) -> None:
        """The request ended: drop its state (suffix: remember its output for its tenant)."""
        ...


class NgramDrafter:
    """vLLM's n-gram prompt lookup over the request's own prompt and output."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self._own: dict[str, NgramIndex] = {}

    def _index(self, request_id: str, prompt: Sequence[int], output: Sequence[int]) -> NgramIndex:
        """The request's index, brought up to date with its tokens (prompt, then output)."""
        idx = self._own.get(request_id)
        total = len(prompt) + len(output)
        if idx is None or len(idx.tokens) > total:
            idx = self._own[request_id] = NgramIndex(self.n_min, self.n_max)
        have = len(idx.tokens)
        if have < len(prompt):
            idx.extend([*prompt[have:], *output])
        elif have < total:
            idx.extend(output[have - len(prompt):])
        return idx

    def propose(self, request_id: str, tenant: str, prompt: Sequence[int], output: Sequence[int],
                k: int) -> list[int]:
        if k <= 0:
            return []
        idx = self._index(request_id, prompt, output)
        n, end = idx.match(idx.tokens[-self.n_max:])
        return idx.continuation(end, k) if n else []

    def finish(self, request_id: str, tenant: str, output_token_ids: Sequence[int]) -> None:
        self._own.pop(request_id, None)


class _TenantOutputs:
    """The recent outputs of one tenant's finished requests, indexed as one sequence (each
    output followed by a separator no real token equals); rebuilt from the window when the
    oldest output drops out."""

    __slots__ = ("window", "index", "n_min", "n_max")

    def __init__(self, n_min: int, n_max: int, max_outputs: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.window: deque[list[int]] = deque(maxlen=max_outputs)
        self.index = NgramIndex(n_min, n_max)

    def add(self, output: Sequence[int]) -> None:
        full = len(self.window) == self.window.maxlen
        self.window.append([*output, -1])
        if full:   # the oldest fell out: re-index what is left
            self.index = NgramIndex(self.n_min, self.n_max)
            for out in self.window:
                self.index.extend(out)
        else:
            self.index.extend(self.window[-1])


class SuffixDrafter(NgramDrafter):
    """Suffix decoding: the request's own tokens plus its tenant's recent outputs."""

    def __init__(self, n_min: int, n_max: int, max_cached_requests: int = 64, max_tenants: int = 256) -> None:
        super().__init__(n_min, n_max)
        self.max_cached_requests = max_cached_requests
        self.max_tenants = max_tenants
        self._tenants: OrderedDict[str, _TenantOutputs] = OrderedDict()   # least recently used first

    @property
    def num_tenants(self) -> int:
        return len(self._tenants)

    def propose(self, request_id: str, tenant: str, prompt: Sequence[int], output: Sequence[int],
                k: int) -> list[int]:
        if k <= 0:
            return []
        idx = self._index(request_id, prompt, output)
        suffix = idx.tokens[-self.n_max:]
        n, end = idx.match(suffix)
        shared = self._tenants.get(tenant)
        if shared is not None:
            n2, end2 = shared.index.match(suffix)
            if n2 > n:
                draft = shared.index.continuation(end2, k)
                return draft[:draft.index(-1)] if -1 in draft else draft
        return idx.continuation(end, k) if n else []

    def finish(self, request_id: str, tenant: str, output_token_ids: Sequence[int]) -> None:
        super().finish(request_id, tenant, output_token_ids)
        if self.max_cached_requests > 0 and self.max_tenants > 0 and output_token_ids:
            shared = self._tenants.get(tenant)
            if shared is None:
                if len(self._tenants) >= self.max_tenants:
                    self._tenants.popitem(last=False)
                shared = self._tenants[tenant] = _TenantOutputs(self.n_min, self.n_max, self.max_cached_requests)
            else:
                self._tenants.move_to_end(tenant)
            shared.add(output_token_ids)


def make_drafter(method: str, n_min: int, n_max: int, max_cached_requests: int = 64) -> NgramDrafter:
    if method == "ngram":
        return NgramDrafter(n_min, n_max)
    if method == "suffix":
        return SuffixDrafter(n_min, n_max, max_cached_requests)
    raise ValueError(f"speculative_config.method must be ngram or suffix, got {method!r}")
