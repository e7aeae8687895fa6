"""A step's rows from its plan (`StepPlan`): per request the `ScheduledRequest` the executor runs
(its chunk of tokens, where it starts, the blocks it was given, whether it samples), its computed
tokens advanced and the service charged. Pure Python; `Scheduler._build_output` calls it once per
step. Every request of every step passes here (the simulator's hot path): a plain decode row is
built inline, and decode rows are charged to the tenant ledger together, before any other row (the
same sums, in the same order)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pacer.request import Request
from pacer.sched.contract import ScheduledRequest
from pacer.sched.fair_share import ServiceLedger
from pacer.sched.step_plan import StepPlan

__all__ = ["build_rows", "build_row", "Account", "SamplingIds"]

Account = Callable[[Request, int, int, int], None]   # a policy's `account` (request, prefill, cached, decode)


def build_rows(step: StepPlan, account: Account | None, ledger: ServiceLedger | None
               ) -> tuple[list[ScheduledRequest], int, int]:
    """The step's rows, each request's computed tokens advanced; (rows, prefill tokens, decode
    tokens). `account`: the policy's hook (None: a no-op); `ledger`: where service is charged
    (None: the policy charges its own)."""
    scheduled: list[ScheduledRequest] = []
    num_prefill = num_decode = 0
    requests, is_new_ids, step_drafts, new_blocks = step.requests, step.is_new, step.drafts, step.new_blocks
    decode_tenants: list[str] = []
    append, charge = scheduled.append, decode_tenants.append if ledger is not None else None
    for req_id, n in step.num_tokens.items():
        req = requests[req_id]
        start = req.num_computed_tokens
        i = start - len(req.prompt_token_ids)   # its position among the outputs
        if n != 1 or i < 0 or req_id in is_new_ids or (step_drafts and req_id in step_drafts):
            if ledger is not None:
                ledger.charge_decode_rows(decode_tenants)
                decode_tenants.clear()
            row = build_row(step, req, n, account, ledger)
            append(row)
            if row.is_prefill:
                num_prefill += n
            else:
                num_decode += n
            continue
        outputs = req.output_token_ids
        num_out = len(outputs)
        append(ScheduledRequest(req_id, outputs[i:i + 1], start, new_blocks[req_id], False, i + 1 == num_out,
                                False, num_out))
        req.num_computed_tokens = start + 1
        num_decode += 1
        if account is not None:
            account(req, 0, 0, 1)
        if charge is not None:
            charge(req.tenant)
    if ledger is not None:
        ledger.charge_decode_rows(decode_tenants)
    return scheduled, num_prefill, num_decode


def build_row(step: StepPlan, req: Request, n: int, account: Account | None,
              ledger: ServiceLedger | None) -> ScheduledRequest:
    """One row of the step (any kind); advances the request's computed tokens and charges it."""
    req_id, start = req.request_id, req.num_computed_tokens
    is_new = req_id in step.is_new
    drafts = step.drafts.get(req_id, ()) if step.drafts else ()
    end = start + n - len(drafts)
    num_prompt = len(req.prompt_token_ids)
    is_prefill = (is_new and not drafts) or end - start > 1 or start < num_prompt
    sp = req.sampling_params
    prompt_history, output_history = req.penalty_history() if is_new else (None, None)
    outputs = req.output_token_ids
    num_out = len(outputs)
    row = ScheduledRequest(
        req_id, outputs[start - num_prompt:end - num_prompt] if start >= num_prompt
        else req.token_ids_slice(start, end), start, step.new_blocks[req_id], is_new,
        end == num_prompt + num_out, is_prefill, num_out,
        sp if is_new else None, prompt_history, output_history, drafts,
        0 if sp.prompt_logprobs is None else req.prompt_logits_rows(start, end),
    )
    req.num_computed_tokens = start + n   # drafts included: update_from_output rolls back
    if is_prefill:
        req.metrics.prefill_tokens += n
    if account is not None:
        account(req, n if is_prefill else 0, start if is_new else 0, 0 if is_prefill else n)
    if ledger is not None:
        ledger.charge_row(req.tenant, n, is_prefill, start if is_new else 0)
    return row


class SamplingIds:
    """The ids of the rows that sample, in row order, listed each time they are iterated (the
    structured and reasoning runtimes read them only when some request is constrained or thinks)."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[ScheduledRequest]) -> None:
        self._rows = rows

    def __iter__(self) -> Iterator[str]:
        return (sr.request_id for sr in self._rows if sr.sample)
