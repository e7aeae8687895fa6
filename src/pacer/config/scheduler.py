"""The scheduler's part of the engine config: step budget, policy, aging, SLO targets, preemption,
speculation (vLLM's names)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pacer.config.checks import PREEMPTION_MODES, SCHEDULING_POLICIES, choice, positive_int

if TYPE_CHECKING:
    from pacer.config.fair import FairSettings
    from pacer.config.slo import SloSet
    from pacer.config.speculative import SpeculativeConfig

__all__ = ["SchedulerConfig", "DEFAULT_MAX_NUM_BATCHED_TOKENS"]

DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass(slots=True)
class SchedulerConfig:
    max_num_seqs: int = field(default=256, metadata={"help": "Most requests running at once."})
    max_num_batched_tokens: int | None = field(
        default=None,
        metadata={"help": "Token budget of one step (prefill chunks + decode tokens). "
                          f"Default {DEFAULT_MAX_NUM_BATCHED_TOKENS} with chunked prefill, "
                          "max_model_len without."},
    )
    max_model_len: int | None = field(
        default=None, metadata={"help": "Longest prompt+output; default: the model's context length."}
    )
    enable_chunked_prefill: bool = field(
        default=True,
        metadata={"help": "Split long prompts across steps and mix them with decodes (decode-first). "
                          "Off: prompts are prefilled whole, in prefill-only steps."},
    )
    scheduling_policy: str = field(
        default="fcfs",
        metadata={"help": "Waiting-queue order: fcfs | priority | sjf | lpm (longest cached prefix first) | "
                          "slo (earliest TTFT deadline first, step budget by the tightest ITL target, preempt the most slack) | "
                          "fair (least normalized tenant service first, VTC)."}
    )
    max_queue_delay: float | None = field(
        default=None,
        metadata={"help": "Aging: a request waiting longer than this many seconds is served in arrival order "
                          "ahead of the rest, under any policy. Default: off for fcfs and priority, 30 for "
                          "sjf, lpm and slo; 'inf' turns it off."})
    slo: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Latency targets per class, the syntax of `pacer bench --slo`: ttft=300ms,itl=50ms "
                          "(default), rag:ttft=2s, batch:e2e=60s (repeatable). Read by the slo policy, "
                          "/metrics attainment counters and reports."})
    shed_hopeless: bool = field(
        default=False,
        metadata={"help": "slo policy: refuse (HTTP 429 slo_unattainable) a waiting request that can no longer "
                          "meet its TTFT, before it is scheduled, instead of serving it late."})
    slo_admission_margin: float = field(
        default=1.25,
        metadata={"help": "slo policy: refuse at once (HTTP 429 slo_unattainable) an arrival whose predicted TTFT "
                          "(its wait so far plus the predicted prefill of the feasible requests ahead of it and its "
                          "own) exceeds this many times its TTFT target; 0 turns it off."})
    allow_tighter_slo: bool = field(
        default=True,
        metadata={"help": "Whether a request's own targets (body `slo`, x-llm-d-slo-* headers) may be tighter "
                          "than its class's (off: they are clamped to the class's)."})
    fair_deficit_bound: float | None = field(
        default=None,
        metadata={"help": "Fair share as a layer on lpm and slo: a tenant whose service runs ahead of the least "
                          "served backlogged tenant's by more than this many cost units waits (default: off)."})
    fair_tenant_weights: dict[str, float] | None = field(
        default=None,
        metadata={"help": "Tenant shares of the engine for fair and the deficit bound, e.g. 'gold=2,free=1' "
                          "(default 1 each)."})
    fair_cost_prefill: float = field(default=1.0, metadata={"help": "Cost units of one computed prompt token."})
    fair_cost_cached: float = field(default=0.1, metadata={"help": "Cost units of one prompt token from cache."})
    fair_cost_decode: float = field(default=2.0, metadata={"help": "Cost units of one decoded token."})
    preemption_mode: str = field(default="recompute", metadata={"help": "recompute | swap."})
    prefill_dedup: bool = field(
        default=True,
        metadata={"help": "With prefix caching: a waiting request whose next prompt block another running request "
                          "is computing waits a step for it instead of computing it twice (exact dedup)."})
    long_prefill_token_threshold: int | None = field(
        default=None,
        metadata={"help": "With chunked prefill: most prompt tokens one request may take in a step, so a "
                          "long prompt leaves budget for short newcomers (vLLM's name; default: no cap)."},
    )
    speculative_config: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Speculative decoding, vLLM's JSON: {\"method\": \"ngram\" | \"suffix\", "
                          "\"num_speculative_tokens\": k, \"prompt_lookup_min\": 5, \"prompt_lookup_max\": 5}. "
                          "Drafts are tokens under the step's budget, verified in the same forward."})
    speculative_policy: str = field(
        default="adaptive",
        metadata={"help": "adaptive (per request and step, 0..k drafts from its acceptance rate and the step's "
                          "marginal token cost: speculation fades as the batch grows) | static (always k: vLLM's)."})

    def validate(self) -> None:
        positive_int("max_num_seqs", self.max_num_seqs)
        if self.max_num_batched_tokens is not None:
            positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_model_len is not None:
            positive_int("max_model_len", self.max_model_len)
        if self.long_prefill_token_threshold is not None:
            positive_int("long_prefill_token_threshold", self.long_prefill_token_threshold)
        choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        if self.max_queue_delay is not None and (isinstance(self.max_queue_delay, bool) or not isinstance(
                self.max_queue_delay, int | float) or not self.max_queue_delay > 0):
            raise ValueError(f"max_queue_delay must be > 0 seconds (or inf for off), got {self.max_queue_delay!r}")
        if isinstance(self.slo, str):
            self.slo = (self.slo,)
        self.slo = tuple(self.slo)
        self.slo_set()   # raises ValueError naming the bad key, duration or class
        if isinstance(self.slo_admission_margin, bool) or not isinstance(self.slo_admission_margin, int | float) \
                or not 0 <= self.slo_admission_margin < float("inf"):
            raise ValueError(f"slo_admission_margin must be a number >= 0 (0: off), got {self.slo_admission_margin!r}")
        choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        self.fair_settings()   # raises ValueError naming the fair_* field and its limit
        from pacer.config.speculative import SPECULATIVE_POLICIES, parse_speculative_config

        parse_speculative_config(self.speculative_config)   # raises naming speculative_config.<key>
        choice("speculative_policy", self.speculative_policy, SPECULATIVE_POLICIES)
        if not isinstance(self.enable_chunked_prefill, bool):
            raise TypeError(f"enable_chunked_prefill must be a bool, got {self.enable_chunked_prefill!r}")

    def speculative(self) -> SpeculativeConfig | None:
        """The parsed speculative_config (None: speculation off)."""
        from pacer.config.speculative import parse_speculative_config

        return parse_speculative_config(self.speculative_config)

    def fair_settings(self) -> FairSettings:
        from pacer.config.fair import FairSettings

        return FairSettings.make(self.fair_deficit_bound, self.fair_tenant_weights, self.fair_cost_prefill,
                                 self.fair_cost_cached, self.fair_cost_decode)

    def slo_set(self) -> SloSet:
        from pacer.config.slo import parse_slo

        return parse_slo(self.slo)

    def resolved(self, model_max_len: int) -> SchedulerConfig:
        """A copy with defaults filled in from the model; checks cross-field limits."""
        max_len = self.max_model_len or model_max_len
        if max_len > model_max_len:
            raise ValueError(
                f"max_model_len={max_len} exceeds the model's context length {model_max_len}"
            )
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = DEFAULT_MAX_NUM_BATCHED_TOKENS if self.enable_chunked_prefill else max_len
            if not self.enable_chunked_prefill:
                budget = max(budget, DEFAULT_MAX_NUM_BATCHED_TOKENS)
        if not self.enable_chunked_prefill and budget < max_len:
            raise ValueError(
                f"max_num_batched_tokens={budget} is smaller than max_model_len={max_len}; without "
                "chunked prefill a whole prompt must fit one step (raise it, lower max_model_len, "
                "or enable chunked prefill)"
            )
        if budget < self.max_num_seqs and self.enable_chunked_prefill:
            budget = max(budget, 1)
        spec = self.speculative()
        if spec is not None:
            spec.check_budget(budget, max_len)
        return dataclasses.replace(self, max_model_len=max_len, max_num_batched_tokens=budget)
