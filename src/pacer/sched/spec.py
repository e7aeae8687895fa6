"""Speculative decoding as a scheduling decision: who drafts, how many tokens. Pure Python.

A decoding request may be scheduled 1 + d tokens: its last token plus d drafted ones, all
inside the step's token budget (drafts are planned last, from what the budget has left once
decodes and prefill chunks are placed: never on top of it, and never by preempting anyone).
The executor verifies them in the same packed forward and returns the accepted drafts plus
one more token; `accepted(...)` rolls `num_computed_tokens` back to the verified tokens and
the KV manager frees any block only the rejected drafts used (`kept_blocks` is the rule the
executors apply to their mirrored block tables too).

Policies (`speculative_policy`):
- `static`: d = k whenever the drafter has k tokens (vLLM's behaviour).
- `adaptive`: per request and step, add draft j (j = 1..k) while its expected tokens per
  second beat the step's: alpha^j / cost(one more token) > expected tokens / step time, where
  alpha is the request's recent per-token acceptance rate and the costs come from the
  `StepCostModel` the simulator uses. While a step is memory-bound a token is nearly free and
  drafts pay; once it is compute-bound a token costs full price and speculation fades out.
  (The marginal cost is `token_cost_s`: one more decode-like token in this step.)

Speculation is off for requests with penalties or structured outputs (their per-token state
would have to advance along unverified drafts); logprobs work (one per emitted token).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pacer.config.speculative import SpeculativeConfig
from pacer.request import Request
from pacer.sched.contract import ScheduledRequest
from pacer.sched.drafters import NgramDrafter, make_drafter
from pacer.sched.step_cost import StepCostModel, StepShape

__all__ = ["SpecDecoder", "SpecStats", "PRIOR_ACCEPTANCE"]

PRIOR_ACCEPTANCE = 0.5   # a request's acceptance rate before it has verified any draft
_EWMA = 0.3              # weight of the newest step in a request's acceptance counts
_RELAX = 0.02            # per step without drafts, the estimate drifts this far back to the prior,
                         # so a request whose text turns repetitive later is tried again


@dataclass(slots=True)
class SpecStats:
    """Monotonic counters with vLLM's meanings (spec_decode_num_drafts: steps that drafted)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    num_rejections: int = 0   # drafting rows whose drafts did not all hold (pacer's, for the per-token rate)

    @property
    def acceptance_rate(self) -> float:
        """vLLM's: accepted / drafted tokens."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def per_token_acceptance(self) -> float:
        """The chance a draft holds given the ones before it did: accepted / (accepted +
        rejections). The simulator's acceptance model takes this rate."""
        tried = self.num_accepted_tokens + self.num_rejections
        return self.num_accepted_tokens / tried if tried else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per drafting step (accepted drafts + the verified one), vLLM's."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @classmethod
    def sum(cls, totals: Mapping[str, Any], step: Any) -> SpecStats:
        """`totals` (an `as_dict()`) plus one StepStats' spec counts."""
        per_pos = list(totals["accepted_per_pos"])
        for i, n in enumerate(step.accepted_per_pos):
            if i == len(per_pos):
                per_pos.append(0)
            per_pos[i] += n
        return cls(totals["num_drafts"] + step.num_drafts, totals["num_draft_tokens"] + step.num_draft_tokens,
                   totals["num_accepted_tokens"] + step.num_accepted_tokens, per_pos,
                   totals["num_rejections"] + step.num_spec_rejections)

    def as_dict(self) -> dict[str, Any]:
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens, "accepted_per_pos": list(self.accepted_per_pos),
                "num_rejections": self.num_rejections, "acceptance_rate": self.acceptance_rate,
                "per_token_acceptance": self.per_token_acceptance, "mean_accepted_length": self.mean_accepted_length}


class _Acceptance:
    __slots__ = ("accepted", "trials")

    def __init__(self) -> None:
        self.accepted = PRIOR_ACCEPTANCE   # decayed counts: a per-token (geometric) acceptance estimate
        self.trials = 1.0

    @property
    def rate(self) -> float:
        return self.accepted / self.trials

    def relax(self) -> None:
        self.accepted += _RELAX * (PRIOR_ACCEPTANCE * self.trials - self.accepted)

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        # each accepted draft is a success; the first rejected one (if any) the only failure
        trials = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.accepted = (1 - _EWMA) * self.accepted + _EWMA * num_accepted
        self.trials = (1 - _EWMA) * self.trials + _EWMA * trials


@dataclass(frozen=True, slots=True)
class DraftCandidate:
    request: Request
    start: int                 # num_computed_tokens before this step (the last token's position)
    drafts: list[int]          # what the drafter proposed (up to k)


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, policy: str, cost_model: StepCostModel | None) -> None:
        if policy == "adaptive" and cost_model is None:
            raise ValueError("speculative_policy='adaptive' needs a step cost model (cost_model=...; the Engine "
                             "builds one from `pacer sim calibrate`'s fit or the simulator's profile)")
        self.config = config
        self.policy = policy
        self.cost_model = cost_model
        self.drafter: NgramDrafter = make_drafter(config.method, config.prompt_lookup_min, config.prompt_lookup_max,
                                                  config.suffix_max_cached_requests)
        self.stats = SpecStats(accepted_per_pos=[0] * config.k)
        self._acceptance: dict[str, _Acceptance] = {}
        self._seen = SpecStats(accepted_per_pos=[0] * config.k)   # totals at the last take_step_counts

    @staticmethod
    def eligible(req: Request) -> bool:
        sp = req.sampling_params
        return not sp.needs_history and sp.structured_outputs is None and not sp.bad_words_token_ids

    def acceptance_rate(self, request_id: str) -> float:
        acc = self._acceptance.get(request_id)
        return PRIOR_ACCEPTANCE if acc is None else acc.rate

    def propose(self, req: Request, start: int) -> DraftCandidate | None:
        """The drafter's proposal for a request decoding its last token this step."""
        sp = req.sampling_params
        room = min(self.config.k, sp.max_tokens - req.num_output_tokens - 1)
        if room <= 0 or not self.eligible(req):
            return None
        drafts = self.drafter.propose(req.request_id, req.tenant, req.prompt_token_ids, req.output_token_ids, room)
        return DraftCandidate(req, start, drafts) if drafts else None

    def choose(self, candidates: list[DraftCandidate], shape: StepShape, num_sampled: int,
               tokens_left: int) -> dict[str, int]:
        """Draft lengths per request id (0s left out), within `tokens_left` tokens."""
        if self.policy == "static" or self.cost_model is None:
            out: dict[str, int] = {}
            for c in candidates:
                d = min(len(c.drafts), tokens_left)
                if d > 0:
                    out[c.request.request_id] = d
                    tokens_left -= d
            return out
        chosen = self._choose_adaptive(candidates, shape, num_sampled, tokens_left, self.cost_model)
        for c in candidates:
            acc = self._acceptance.get(c.request.request_id)
            if acc is not None and c.request.request_id not in chosen:
                acc.relax()
        return chosen

    def _choose_adaptive(self, candidates: list[DraftCandidate], shape: StepShape, num_sampled: int,
                         tokens_left: int, cost: StepCostModel) -> dict[str, int]:
        step_s = cost.predict_step_s(shape)
        expected = float(num_sampled)
        out: dict[str, int] = {}
        ranked = sorted(candidates, key=lambda c: -self.acceptance_rate(c.request.request_id))
        for c in ranked:
            alpha = self.acceptance_rate(c.request.request_id)
            gain = 1.0
            for j in range(len(c.drafts)):
                if tokens_left <= 0:
                    return out
                gain *= alpha
                ctx = c.start + j + 2
                extra_s = cost.token_cost_s(shape, ctx)
                # draft j pays when its expected tokens per second beat the step's
                if step_s > 0 and gain * step_s <= expected * max(extra_s, 0.0):
                    break
                shape = shape.with_decode(ctx)
                step_s += max(extra_s, 0.0)
                expected += gain
                tokens_left -= 1
                out[c.request.request_id] = j + 1
        return out

    def plan(self, scheduled: Mapping[str, int], requests: Mapping[str, Request],
             tokens_left: int) -> dict[str, list[int]]:
        """Drafts per request id for a step whose rows are `scheduled` (request id -> tokens),
        within `tokens_left`: for the rows that decode their last token."""
        shape, candidates, num_sampled = StepShape(), [], 0
        for rid, n in scheduled.items():
            req = requests[rid]
            start = req.num_computed_tokens
            sample = start + n == req.num_tokens
            shape = shape.with_chunk(n, start, sample)
            num_sampled += sample
            if n == 1 and sample and tokens_left > 0:
                cand = self.propose(req, start)
                if cand is not None:
                    candidates.append(cand)
        if not candidates:
            return {}
        by_id = {c.request.request_id: c for c in candidates}
        return {rid: by_id[rid].drafts[:d] for rid, d in self.choose(candidates, shape, num_sampled, tokens_left).items()}

    def verified(self, req: Request, sr: ScheduledRequest, tokens: Sequence[int]) -> Sequence[int]:
        """A verified draft step: the executor returned the accepted drafts and one more token.
        Rolls `num_computed_tokens` back to the verified tokens (the rejected drafts' KV is void;
        the KV manager's `trim_to_computed` frees blocks only they used) and counts them."""
        num_drafted = len(sr.draft_token_ids)
        if not 1 <= len(tokens) <= num_drafted + 1 or list(tokens[:-1]) != list(sr.draft_token_ids[:len(tokens) - 1]):
            raise ValueError(f"{sr.request_id}: the executor returned {list(tokens)} for drafts "
                             f"{list(sr.draft_token_ids)} (expected the accepted drafts and one more token)")
        num_accepted = len(tokens) - 1
        req.num_computed_tokens = sr.start_position + 1 + num_accepted
        self.accepted(sr.request_id, num_drafted, num_accepted)
        return tokens

    def accepted(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """Record a verification: `num_accepted` of `num_drafted` drafts held."""
        if num_drafted <= 0:
            return
        acc = self._acceptance.get(request_id)
        if acc is None:
            acc = self._acceptance[request_id] = _Acceptance()
        acc.observe(num_drafted, num_accepted)
        st = self.stats
        st.num_drafts += 1
        st.num_draft_tokens += num_drafted
        st.num_accepted_tokens += num_accepted
        st.num_rejections += num_accepted < num_drafted
        for pos in range(min(num_accepted, len(st.accepted_per_pos))):
            st.accepted_per_pos[pos] += 1

    def take_step_counts(self) -> dict[str, Any]:
        """The counts since the last call, under StepStats' field names (one step's)."""
        now, seen = self.stats, self._seen
        counts = {"num_drafts": now.num_drafts - seen.num_drafts,
                  "num_draft_tokens": now.num_draft_tokens - seen.num_draft_tokens,
                  "num_accepted_tokens": now.num_accepted_tokens - seen.num_accepted_tokens,
                  "accepted_per_pos": tuple(a - b for a, b in zip(now.accepted_per_pos, seen.accepted_per_pos)),
                  "num_spec_rejections": now.num_rejections - seen.num_rejections}
        self._seen = SpecStats(now.num_drafts, now.num_draft_tokens, now.num_accepted_tokens,
                               list(now.accepted_per_pos), now.num_rejections)
        return counts

    def finish(self, req: Request) -> None:
        self._acceptance.pop(req.request_id, None)
        self.drafter.finish(req.request_id, req.tenant, req.output_token_ids)

    def drop(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            self._acceptance.pop(rid, None)
