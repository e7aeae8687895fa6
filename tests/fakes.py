"""A fake executor for core tests: no tensors, but it checks the KV bookkeeping.

It keeps a map slot -> (token, position) as a real KV cache would hold keys, verifies that
every step's cached context is exactly the request's own earlier tokens (and that a new
request with penalties brings its whole token history), and "samples" a token that is a
deterministic function of the request's whole sequence, like a greedy model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pacer.core.outputs import ScheduledRequest, SchedulerOutput
from pacer.core.scheduler import Scheduler
from pacer.request import Request


def next_token(tokens: list[int], vocab: int) -> int:
    h = 1469598103
    for t in tokens:
        h = (h ^ t) * 1099511628211 % (1 << 61)
    return h % vocab


@dataclass
class FakeResult:
    sampled: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)


class FakeExecutor:
    def __init__(self, block_size: int, vocab: int = 1000) -> None:
        self.block_size = block_size
        self.vocab = vocab
        self.scheduler: Scheduler | None = None   # god view, for checking only
        self.slots: dict[int, tuple[int, int]] = {}
        self.tables: dict[str, list[int]] = {}
        self.steps: list[SchedulerOutput] = []
        self.cpu: dict[int, list[tuple[int, int] | None]] = {}   # swap tier: cpu slot -> block contents

    def _swap(self, out: SchedulerOutput) -> None:
        bs = self.block_size
        for dev, slot in getattr(out, "swap_out", ()):
            self.cpu[slot] = [self.slots.get(dev * bs + i) for i in range(bs)]
        for slot, dev in getattr(out, "swap_in", ()):
            for i, content in enumerate(self.cpu.pop(slot)):
                if content is None:
                    self.slots.pop(dev * bs + i, None)
                else:
                    self.slots[dev * bs + i] = content

    @staticmethod
    def _check_history(sr: ScheduledRequest, req: Request) -> None:
        """A new request with penalties carries its whole token history; others carry none."""
        assert sr.sampling_params is not None
        if sr.sampling_params.has_penalties:
            assert sr.prompt_token_ids == req.prompt_token_ids, sr.request_id
            assert sr.output_token_ids == req.output_token_ids, sr.request_id
        else:
            assert sr.prompt_token_ids is None and sr.output_token_ids is None, sr.request_id

    def _slot(self, table: list[int], p: int) -> int:
        return table[p // self.block_size] * self.block_size + p % self.block_size

    def execute(self, out: SchedulerOutput) -> FakeResult:
        assert self.scheduler is not None
        self.steps.append(out)
        self._swap(out)
        for rid in (*out.finished_ids, *out.preempted_ids):
            self.tables.pop(rid, None)
        sampled: dict[str, int] = {}
        for sr in out.scheduled:
            req = self.scheduler.requests[sr.request_id]
            if sr.is_new:
                self.tables[sr.request_id] = list(sr.block_ids)
                self._check_history(sr, req)
            else:
                self.tables[sr.request_id].extend(sr.block_ids)
            table = self.tables[sr.request_id]
            seq = req.prompt_token_ids + req.output_token_ids
            for p in range(sr.start_position):
                got = self.slots.get(self._slot(table, p))
                assert got == (seq[p], p), f"{sr.request_id}: stale KV at position {p}: {got} != {(seq[p], p)}"
            for i, t in enumerate(sr.token_ids):
                p = sr.start_position + i
                assert t == seq[p], f"{sr.request_id}: token at {p} is {t}, expected {seq[p]}"
                self.slots[self._slot(table, p)] = (t, p)
            end = sr.start_position + sr.num_tokens
            if sr.sample:
                assert end == len(seq)
                sampled[sr.request_id] = next_token(seq[:end], self.vocab)
        return FakeResult(sampled)
