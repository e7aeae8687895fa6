"""Exact dedup of in-flight prefill (pure Python): a request whose next prompt block another
running request is computing right now waits for it instead of computing it twice.

The prefix cache shares a block once it is computed; two requests with the same prefix that
arrive together would both compute it (vLLM does). Each step the scheduler registers the full
prompt blocks its prefilling requests (running, and admitted earlier in the step) have still to
compute, keyed by the cache owner the blocks will be stored under and a chained hash of the
prompt up to the block. A waiting request whose first block past its cache hit is registered by
another request, under an owner it may read, is *deferred*: it sits out this step (no seat, no
KV, blocks no one behind it) and looks the cache up again next step, when the blocks computed
meanwhile have been shared. The hash only decides a deferral, never what KV is read: a
collision costs a step, not a wrong output. A request is deferred at most `MAX_DEFERRALS` steps
in a row (a stalled owner cannot hold it back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pacer.request import Request

__all__ = ["InflightPrefills", "DedupStats", "MAX_DEFERRALS"]

MAX_DEFERRALS = 64


@dataclass(slots=True)
class DedupStats:
    deferrals: int = 0          # request-steps sat out waiting for another's prefill
    deferred_requests: int = 0  # distinct requests deferred at least once
    shared_tokens: int = 0      # of theirs, prompt tokens found cached when admitted after a deferral


class InflightPrefills:
    """The prompt blocks running prefills are computing, by (owner, chained block hash)."""

    def __init__(self, block_size: int, owner: Callable[[Request], str],
                 owners: Callable[[Request], tuple[str, ...]], exact: Callable[[Request], int] | None = None) -> None:
        """`exact`: of a request's tokens, those whose KV will be exact (cached for others): a
        request filling a reused segment (`pacer.sched.segments`) registers no block past them."""
        self.block_size = block_size
        self._exact = exact
        self._owner = owner
        self._owners = owners
        self._blocks: dict[tuple[str, int], str] = {}   # (owner, hash) -> request id computing it
        self._hashes: dict[str, list[int]] = {}         # request id -> chained hashes of its full prompt blocks
        self._deferred: dict[str, int] = {}             # request id -> consecutive steps deferred
        self.stats = DedupStats()

    def begin_step(self, running: Iterable[Request], live: Callable[[str], bool]) -> None:
        """Register what the running prefills still compute; forget finished requests."""
        self._blocks.clear()
        if len(self._hashes) > 256:
            self._hashes = {rid: h for rid, h in self._hashes.items() if live(rid)}
            self._deferred = {rid: n for rid, n in self._deferred.items() if live(rid)}
        for r in running:
            if r.num_computed_tokens < len(r.prompt_token_ids):   # still prefilling (most rows decode)
                self.register(r)

    def register(self, req: Request) -> None:
        """`req` will compute its prompt blocks from its computed tokens on (it is prefilling)."""
        hashes = self._chain(req)
        owner = self._owner(req)
        end = len(hashes) if self._exact is None else min(len(hashes), self._exact(req) // self.block_size)
        for j in range(req.num_computed_tokens // self.block_size, end):
            self._blocks.setdefault((owner, hashes[j]), req.request_id)

    def should_defer(self, req: Request, hit_tokens: int) -> bool:
        """Whether `req` (waiting, its cache hit `hit_tokens` long) should sit out this step: its
        next full prompt block is being computed by another request it may share with."""
        if not self._blocks:
            return False
        j = hit_tokens // self.block_size
        if j >= (req.num_tokens - 1) // self.block_size:   # no full block left to share (the last is its own)
            return False
        rid = req.request_id
        hashes = self._chain(req)
        if j >= len(hashes) or self._deferred.get(rid, 0) >= MAX_DEFERRALS:
            return False
        if not any(self._blocks.get((owner, hashes[j]), rid) != rid for owner in self._owners(req)):
            return False
        n = self._deferred.get(rid, 0)
        self._deferred[rid] = n + 1
        self.stats.deferrals += 1
        if n == 0:
            self.stats.deferred_requests += 1
        return True

    def admitted(self, req: Request, hit_tokens: int) -> None:
        """`req` is admitted (its computed tokens set) with `hit_tokens` from the cache: what it
        read after a deferral counts, and the blocks it will compute are registered."""
        if self._deferred.pop(req.request_id, None) is not None:
            self.stats.shared_tokens += hit_tokens
        if req.num_computed_tokens < req.num_prompt_tokens:
            self.register(req)

    def _chain(self, req: Request) -> list[int]:
        hashes = self._hashes.get(req.request_id)
        if hashes is None:
            hashes, h = [], 0
            for block in zip(*[iter(req.prompt_token_ids)] * self.block_size):   # its full blocks, as tuples
                h = hash((h, block))
                hashes.append(h)
            self._hashes[req.request_id] = hashes
        return hashes
