"""The deterministic generator of a workload's `RequestSpec`s (`pacer.workload.spec` says what a
workload is), and the requests with their arrival times for `pacer bench` and `pacer sim`.

Same seed, same workload, same tokenizer -> the same requests, token for token. This module
touches only the tokenizer it is given (see `pacer.workload.text`) and does no I/O.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from pacer.workload.arrivals import ArrivalProcess, ClosedLoop, arrival_times
from pacer.workload.spec import ChatMessage, ClassSpec, RequestSpec, Workload
from pacer.workload.text import Segment, TextSource, TokenizerLike

__all__ = ["WorkloadGenerator", "iter_requests", "generate_requests"]


@dataclass(slots=True)
class _Session:
    session_id: str
    num_turns: int
    history: list[tuple[str, Segment]] = field(default_factory=list)
    turn: int = 0


class WorkloadGenerator:
    """An endless, deterministic stream of `RequestSpec`s (arrival_time None) for a workload.

    Each class draws from its own RNG streams, so adding a class to a mix does not change the
    lengths another class draws for its n-th request. Prompts never exceed `max_model_len`
    together with their output: a session that would outgrow it ends and a new one starts.
    """

    def __init__(self, workload: Workload, seed: int = 0, tokenizer: TokenizerLike | None = None,
                 max_model_len: int | None = None) -> None:
        self.workload = workload
        self.seed = seed
        self.max_model_len = max_model_len
        self.text = TextSource(tokenizer)
        self._choose = random.Random(f"{seed}:class")
        self._weights = [c.weight for c in workload.classes]
        self._rngs = {c.name: random.Random(f"{seed}:{c.name}") for c in workload.classes}
        self._prefix = {c.name: self.text.segment(c.shared_prefix_len, random.Random(f"{seed}:{c.name}:prefix"))
                        for c in workload.classes}
        self._sessions: dict[str, list[_Session]] = {c.name: [] for c in workload.classes}
        self._ids = itertools.count()
        self._session_ids = itertools.count()
        for c in workload.classes:
            need = c.shared_prefix_len + 1 + c.output_len.min
            if max_model_len is not None and need > max_model_len:
                raise ValueError(f"class {c.name!r}: shared_prefix_len {c.shared_prefix_len} leaves no room "
                                 f"under max_model_len={max_model_len}")

    def __iter__(self) -> Iterator[RequestSpec]:
        return self

    def __next__(self) -> RequestSpec:
        cls = self._choose.choices(self.workload.classes, weights=self._weights)[0]
        return self._next_of(cls)

    def _session_for(self, cls: ClassSpec, rng: random.Random) -> _Session:
        open_sessions = self._sessions[cls.name]
        if len(open_sessions) < cls.concurrent_sessions:
            s = _Session(f"{cls.name}-{next(self._session_ids)}", max(1, cls.turns.sample(rng)))
            open_sessions.append(s)
            return s
        return open_sessions[rng.randrange(len(open_sessions))]

    def _next_of(self, cls: ClassSpec) -> RequestSpec:
        rng = self._rngs[cls.name]
        session = self._session_for(cls, rng)
        new_len = cls.prompt_len.sample(rng)
        out_len = cls.output_len.sample(rng)
        prefix = self._prefix[cls.name]
        history_len = sum(len(seg) for _, seg in session.history)
        if self.max_model_len is not None:
            room = self.max_model_len - len(prefix) - history_len - out_len
            if room < 1 and session.history:
                self._sessions[cls.name].remove(session)   # the conversation outgrew the context
                return self._next_of(cls)
            new_len = max(1, min(new_len, room))
            out_len = min(out_len, self.max_model_len - len(prefix) - history_len - new_len)
        user = self.text.segment(new_len, rng)
        spec = self._spec(cls, session, prefix, user, out_len)
        session.turn += 1
        if session.turn >= session.num_turns:
            self._sessions[cls.name].remove(session)
        else:
            session.history += [("user", user), ("assistant", self.text.segment(out_len, rng))]
        return spec

    def _spec(self, cls: ClassSpec, session: _Session, prefix: Segment, user: Segment,
              out_len: int) -> RequestSpec:
        parts = [prefix, *(seg for _, seg in session.history), user]
        messages = [ChatMessage("system", prefix.text.strip())] if len(prefix) else []
        messages += [ChatMessage(role, seg.text.strip()) for role, seg in session.history]
        messages.append(ChatMessage("user", user.text.strip()))
        return RequestSpec(
            request_id=f"req-{next(self._ids)}", request_class=cls.name,
            prompt="".join(p.text for p in parts),
            prompt_token_ids=tuple(t for p in parts for t in p.token_ids),
            output_tokens=max(1, out_len), messages=tuple(messages),
            session=session.session_id if session.num_turns > 1 else None, turn=session.turn,
            tenant=cls.tenant, priority=cls.priority, ignore_eos=cls.ignore_eos,
        )


def iter_requests(workload: Workload, arrivals: ArrivalProcess, *, seed: int = 0,
                  num_requests: int | None = None, duration: float | None = None,
                  tokenizer: TokenizerLike | None = None,
                  max_model_len: int | None = None) -> Iterator[RequestSpec]:
    """Requests with their send times (open loop) or arrival_time None (closed loop), lazily.

    Open loop stops after `num_requests` or past `duration`; closed loop stops after
    `num_requests` or never (the runner stops sending once `duration` has passed)."""
    gen: Iterator[RequestSpec] = (workload.source.requests(seed, tokenizer, max_model_len)
                                  if workload.source is not None else
                                  WorkloadGenerator(workload, seed, tokenizer, max_model_len))
    if isinstance(arrivals, ClosedLoop):
        specs: Iterator[RequestSpec] = iter(gen)
        if num_requests is not None:
            specs = itertools.islice(specs, num_requests)
        yield from specs
        return
    for t, spec in zip(arrival_times(arrivals, seed, num_requests, duration), gen):
        yield spec.with_arrival(t)


def generate_requests(workload: Workload, arrivals: ArrivalProcess, *, seed: int = 0,
                      num_requests: int | None = None, duration: float | None = None,
                      tokenizer: TokenizerLike | None = None,
                      max_model_len: int | None = None) -> list[RequestSpec]:
    """`iter_requests` as a list; needs `num_requests`, or `duration` with an open-loop process."""
    if num_requests is None and (duration is None or arrivals.is_closed_loop):
        raise ValueError("give num_requests (or duration with a request rate): the list would be endless")
    return list(iter_requests(workload, arrivals, seed=seed, num_requests=num_requests, duration=duration,
                              tokenizer=tokenizer, max_model_len=max_model_len))
