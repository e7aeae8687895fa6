"""ModelExecutor: runs one SchedulerOutput on a real model and returns sampled tokens.

It owns the KV tensors and mirrors, from the SchedulerOutput alone, each request's block
table and sampling params, and, for requests with penalties, their token history (seeded when
the request is new, extended by each later chunk). It never reads scheduler state.
"""

from __future__ import annotations

import time

import torch

from pacer.model.attention import AttentionMetadata, ChunkSpan, build_metadata
from pacer.model.kv_quant import KVFormat
from pacer.model.llama import LlamaModel
from pacer.model.prompt_logprobs import PromptRows, prompt_entries, prompt_rows_of
from pacer.model.sampler import Sampler, TokenHistory
from pacer.model.segment_copy import apply_segment_copies
from pacer.model.spec_verify import fold_results, sampling_rows
from pacer.request import SamplingParams
from pacer.sched.contract import ModelOutput, RequestResult, ScheduledRequest, SchedulerOutput

__all__ = ["ModelExecutor"]


class _ReqState:
    __slots__ = ("block_table", "params", "history", "prompt_ids")

    def __init__(self, block_table: list[int], params: SamplingParams, history: TokenHistory | None,
                 prompt_ids: list[int] | None) -> None:
        self.block_table = block_table
        self.params = params
        self.history = history
        self.prompt_ids = prompt_ids   # set when params.prompt_logprobs: the targets of prompt rows


class ModelExecutor:
    def __init__(self, model: LlamaModel, num_blocks: int, block_size: int, seed: int = 0,
                 kv_format: KVFormat | None = None) -> None:
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = model.device
        self.kv_format = kv_format or model.kv_format("auto")
        self.kv_caches = model.allocate_kv_cache(num_blocks, block_size, self.kv_format)
        self.sampler = Sampler(seed, model.arch.eos_token_ids)
        self._states: dict[str, _ReqState] = {}
        self._cpu_blocks: dict[int, torch.Tensor] = {}   # swap tier: cpu slot -> [layers, 2, block...]

    @property
    def kv_block_bytes(self) -> int:
        """Bytes of one KV block over all layers, as stored (sizes the CPU swap tier)."""
        a = self.model.arch
        return self.kv_format.bytes_per_token(a.num_layers, a.num_kv_heads, a.head_dim) * self.block_size

    def device_block(self, block_id: int) -> torch.Tensor:
        """One device KV block over all layers, [layers, 2 (K, V), *block], as stored (a copy on CPU)."""
        return torch.stack([torch.stack((k[block_id], v[block_id])) for k, v in self.kv_caches]).to("cpu")

    def host_block(self, slot: int) -> torch.Tensor | None:
        """The host tier's copy in `slot` (device_block's layout); None: never filled."""
        return self._cpu_blocks.get(slot)

    def put_host_block(self, slot: int, block: torch.Tensor) -> None:
        """Fill a host slot (the disk tier reading a block back)."""
        self._cpu_blocks[slot] = block

    def _apply_swaps(self, out: SchedulerOutput) -> None:
        """Before the forward (which may reuse blocks copied out): swap-outs and demotions to the host
        tier, segment saves, then swap-ins and promotions back, then segment fills."""
        if out.swap_out:
            idx = torch.tensor([d for d, _ in out.swap_out], device=self.device)
            saved = torch.stack([torch.stack((k[idx], v[idx])) for k, v in self.kv_caches]).to("cpu")
            for i, (_, slot) in enumerate(out.swap_out):
                self._cpu_blocks[slot] = saved[:, :, i].clone()
        apply_segment_copies(self.kv_caches, out.segment_saves, self.kv_format, self.model.layer_inv_freqs)
        if out.swap_in:
            idx = torch.tensor([d for _, d in out.swap_in], device=self.device)
            # a copy: the host slot keeps its KV (the offload tier may promote it again) until reused
            blocks = torch.stack([self._cpu_blocks[slot] for slot, _ in out.swap_in], dim=2).to(self.device)
            for layer, (k, v) in enumerate(self.kv_caches):
                _as_copyable(k).index_copy_(0, idx, _as_copyable(blocks[layer, 0]))
                _as_copyable(v).index_copy_(0, idx, _as_copyable(blocks[layer, 1]))
        apply_segment_copies(self.kv_caches, out.segment_fills, self.kv_format, self.model.layer_inv_freqs)

    def _sync_states(self, out: SchedulerOutput) -> None:
        for rid in out.finished_ids:
            self._states.pop(rid, None)
        for rid in out.preempted_ids:
            self._states.pop(rid, None)
        for sr in out.scheduled:
            if sr.is_new:
                assert sr.sampling_params is not None
                prompt_ids = sr.prompt_token_ids if sr.sampling_params.prompt_logprobs is not None else None
                if prompt_ids is None and sr.sampling_params.prompt_logprobs is not None:
                    raise ValueError(f"request {sr.request_id} asks for prompt logprobs but came without its prompt")
                state = self._states[sr.request_id] = _ReqState(
                    list(sr.block_ids), sr.sampling_params, self._new_history(sr), prompt_ids)
            else:
                state = self._states[sr.request_id]
                if sr.block_ids:
                    state.block_table.extend(sr.block_ids)
            if state.history is not None:
                state.history.observe(sr.start_position, sr.token_ids)

    @staticmethod
    def _new_history(sr: ScheduledRequest) -> TokenHistory | None:
        if sr.sampling_params is None or not sr.sampling_params.needs_history:
            return None
        if sr.prompt_token_ids is None or sr.output_token_ids is None:
            raise ValueError(f"request {sr.request_id} uses penalties but came without its token history")
        return TokenHistory(sr.prompt_token_ids, sr.output_token_ids)

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        t0 = time.perf_counter()
        self._apply_swaps(out)
        self._sync_states(out)
        if not out.scheduled:
            return ModelOutput(prepare_s=time.perf_counter() - t0, forward_s=0.0)
        singles = [sr for sr in out.scheduled if sr.num_tokens == 1 and not sr.draft_token_ids]
        multis = [sr for sr in out.scheduled if sr.num_tokens > 1 or sr.draft_token_ids]
        input_ids, positions, meta, logits_rows, sample_reqs, prompt_groups = self._prepare(singles, multis)
        num_sample_rows = len(logits_rows)
        logits_rows.extend(r for g in prompt_groups for r in g.rows)
        t1 = time.perf_counter()
        logits = self.model.forward(input_ids, positions, meta, self.kv_caches,
                                    torch.tensor(logits_rows, device=self.device, dtype=torch.long), self.kv_format)
        t2 = time.perf_counter()
        prompt_logprobs = prompt_entries(logits[num_sample_rows:], prompt_groups) if prompt_groups else {}
        logits = logits[:num_sample_rows]
        states = [self._states[sr.request_id] for sr in sample_reqs]
        rows, spans = sampling_rows(sample_reqs, [st.params for st in states], [st.history for st in states])
        if out.token_masks is not None and sample_reqs:   # computed while the forward ran
            logits = out.token_masks.apply(logits, [sr.request_id for sr, n in zip(sample_reqs, spans)
                                                    for _ in range(n)])
        results: dict[str, RequestResult] = {}
        if rows:   # a row with drafts samples each position and keeps the verified ones (spec_verify)
            sampled = self.sampler.sample(logits, rows)
            tables = {sr.request_id: self._states[sr.request_id].block_table for sr in sample_reqs}
            results = fold_results(sample_reqs, spans, sampled.token_ids, sampled.logprobs, tables, self.block_size)
        t3 = time.perf_counter()
        return ModelOutput(results, prepare_s=t1 - t0, forward_s=t2 - t1, sample_s=t3 - t2,
                           prompt_logprobs=prompt_logprobs)

    def _prepare(
        self, singles: list[ScheduledRequest], multis: list[ScheduledRequest]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int], list[ScheduledRequest], list[PromptRows]]:
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        sample_reqs: list[ScheduledRequest] = []
        tables: list[list[int]] = []
        ctx_lens: list[int] = []
        prompt_groups: list[PromptRows] = []
        for i, sr in enumerate(singles):
            self._add_prompt_rows(prompt_groups, sr, i)
            table = self._states[sr.request_id].block_table
            p = sr.start_position
            ids.append(sr.token_ids[0])
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            tables.append(table)
            ctx_lens.append(p + 1)
            if sr.sample:
                logits_rows.append(i)
                sample_reqs.append(sr)
        chunks: list[ChunkSpan] = []
        row = len(singles)
        for sr in multis:
            table = self._states[sr.request_id].block_table
            n, start = sr.num_tokens + len(sr.draft_token_ids), sr.start_position
            ids.extend(sr.token_ids)
            ids.extend(sr.draft_token_ids)
            pos.extend(range(start, start + n))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            chunks.append(ChunkSpan(row, n, start, table[:-(-(start + n) // bs)]))
            self._add_prompt_rows(prompt_groups, sr, row)
            row += n
            if sr.sample:   # drafts: the logits at the last token and at every draft
                logits_rows.extend(range(row - 1 - len(sr.draft_token_ids), row))
                sample_reqs.append(sr)
        dev = self.device
        meta = build_metadata(slots, tables, ctx_lens, chunks, bs, dev, *self.model.rows_on_kernel)
        return (torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta, logits_rows, sample_reqs,
                prompt_groups)

    def _add_prompt_rows(self, groups: list[PromptRows], sr: ScheduledRequest, first_row: int) -> None:
        """The chunk's prompt-scoring rows, for a request that asks for prompt logprobs and has
        not sampled yet (a resume after its first token has them all already)."""
        state = self._states[sr.request_id]
        if state.prompt_ids is None or sr.num_output_tokens > 0:
            return
        k = state.params.prompt_logprobs or 0
        group = prompt_rows_of(sr.request_id, state.prompt_ids, k, first_row, sr.start_position, sr.num_tokens)
        if group is not None:
            groups.append(group)



def _as_copyable(t: torch.Tensor) -> torch.Tensor:
    """float8 has no index_copy_ on CPU; its bytes do."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t
