"""The retry path of a step whose `execute` raised: each of its requests runs alone, so one
bad request fails alone (an error result) and the others keep going. Used by `Engine.step`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from pacer.request import Request
from pacer.sched.contract import Executor, ModelOutput, RequestResult, SchedulerOutput

__all__ = ["execute_each"]

log = logging.getLogger("pacer.engine")


def execute_each(executor: Executor, out: SchedulerOutput, requests: Mapping[str, Request],
                 block_table: Callable[[str], list[int]]) -> ModelOutput:
    """Run each request of the failed step `out` alone (whole block table, as if new to the
    executor): those that fail again get an error result. A step with KV swaps is not retried
    (its copies may have half run): all its requests fail."""
    results: dict[str, RequestResult] = {}
    prompt_logprobs: dict[str, tuple[int, Sequence[Mapping[int, float]]]] = {}
    for sr in out.scheduled:
        req = requests.get(sr.request_id)
        if req is None or out.swap_out or out.swap_in or out.segment_saves or out.segment_fills:
            results[sr.request_id] = RequestResult(error="its step failed with KV swaps in flight")
            continue
        prompt_history, output_history = req.penalty_history()
        alone = replace(sr, is_new=True, block_ids=list(block_table(sr.request_id)),
                        sampling_params=req.sampling_params, prompt_token_ids=prompt_history,
                        output_token_ids=output_history)
        single = SchedulerOutput(step_id=out.step_id, scheduled=[alone],
                                 num_prefill_tokens=sr.num_tokens if sr.is_prefill else 0,
                                 num_decode_tokens=0 if sr.is_prefill else sr.num_tokens,
                                 token_masks=out.token_masks)
        try:
            alone_out = executor.execute(single)
            results.update(alone_out.results)
            prompt_logprobs.update(alone_out.prompt_logprobs)
        except Exception as e:
            log.exception("request %s failed alone; finishing it with an error", sr.request_id)
            results[sr.request_id] = RequestResult(error=f"{type(e).__name__}: {e}")
    return ModelOutput(results, prompt_logprobs=prompt_logprobs)
