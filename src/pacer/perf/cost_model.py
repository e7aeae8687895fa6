"""Step-time cost models: from the batch the scheduler produced to seconds on some hardware.

`batch_features(SchedulerOutput)` reduces a step to counts (tokens, prefill chunks and the
query-key pairs their attention covers, decode rows and the KV they read, sampled rows).
Two models turn counts into time, behind one `CostModel` protocol:

- `RooflineCostModel`: per operator group, max(FLOPs / compute, bytes / bandwidth) -- the
  linear layers (weights read once per step, shared by the batch), attention (prefill:
  compute; decode: KV reads), an all-reduce term per layer under tensor parallelism, and a
  fixed per-step and per-sequence overhead. Used for datasheet hardware.
- `LinearCostModel`: a non-negative linear fit of measured step times on the same
  features (plus a roofline-shaped linear-layer term), made by `pacer sim calibrate`.

Both report the step's estimated compute and bandwidth utilisation, the split that GPU
"utilisation" counters hide: decode is bandwidth-bound, prefill compute-bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pacer.perf.profiles import HardwareProfile, ModelProfile, dtype_bytes, weight_bytes_per_param
from pacer.sched.contract import SchedulerOutput

__all__ = [
    "BatchFeatures", "StepCost", "StepCounts", "CostModel", "RooflineCostModel", "LinearCostModel", "batch_features",
    "LINEAR_FEATURES", "feature_vector", "make_cost_model",
]


@dataclass(slots=True)   # not frozen (read-only by convention): one a step, and a frozen init cost ~5x
class BatchFeatures:
    num_tokens: int = 0
    num_seqs: int = 0
    num_single: int = 0            # one-token rows (decodes): batched attention
    single_kv_tokens: int = 0      # keys those rows read (sum of their context lengths)
    single_max_ctx: int = 0        # longest such context (a padded backend reads num_single x this)
    num_chunks: int = 0            # multi-token rows (prefill chunks): one attention call each
    chunk_attn_pairs: int = 0      # causal query-key pairs of the chunks
    chunk_kv_tokens: int = 0       # context each chunk attends to (earlier chunks read back from KV)
    num_sampled: int = 0           # rows through the LM head and sampler
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_swap_blocks: int = 0       # KV blocks copied to / from host memory before the step (swap preemption)
    num_segment_copy_tokens: int = 0   # tokens of KV copied on the device (segment reuse: stores, re-rotated fills)


def batch_features(out: SchedulerOutput) -> BatchFeatures:
    num_single = single_kv = single_max = chunks = pairs = chunk_kv = sampled = 0
    for sr in out.scheduled:   # every row of every step: each field read once
        drafts = sr.draft_token_ids
        n = len(sr.token_ids) + len(drafts) if drafts else len(sr.token_ids)   # drafts: verified in the same forward
        s = sr.start_position
        if n == 1:
            num_single += 1
            single_kv += s + 1
            if s >= single_max:   # s + 1 > single_max
                single_max = s + 1
        else:
            chunks += 1
            pairs += n * s + n * (n + 1) // 2
            chunk_kv += s + n
        if sr.sample:
            sampled += 1 + len(drafts) if drafts else 1   # every drafted position goes through the LM head
        sampled += sr.prompt_logits_rows             # prompt_logprobs: a logits row per prompt token scored
    return BatchFeatures(
        num_tokens=out.num_prefill_tokens + out.num_decode_tokens, num_seqs=len(out.scheduled),
        num_single=num_single, single_kv_tokens=single_kv, single_max_ctx=single_max, num_chunks=chunks,
        chunk_attn_pairs=pairs, chunk_kv_tokens=chunk_kv, num_sampled=sampled,
        num_prefill_tokens=out.num_prefill_tokens, num_decode_tokens=out.num_decode_tokens,
        num_swap_blocks=len(out.swap_out) + len(out.swap_in),
        num_segment_copy_tokens=sum(c.num_tokens for c in (*out.segment_saves, *out.segment_fills))
        if out.segment_saves or out.segment_fills else 0,
    )


@dataclass(slots=True)   # not frozen (read-only by convention): one a step, and a frozen init cost ~5x
class StepCost:
    time_s: float
    linear_s: float        # projections + MLP + LM head
    attention_s: float
    comm_s: float          # tensor-parallel all-reduces and KV swap copies over the host link
    overhead_s: float
    flops: float
    bytes: float
    compute_util: float    # flops / (time x peak)
    bandwidth_util: float  # bytes / (time x peak bandwidth)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_util >= self.bandwidth_util else "memory"


class CostModel(Protocol):
    name: str

    def step_cost(self, f: BatchFeatures) -> StepCost:
        """Predicted time and utilisation of one engine step."""
        ...


class StepCounts:
    """FLOP and byte counts of one step for a model/dtype (shared by both cost models)."""

    __slots__ = ("model", "bytes_per_el", "layer_flops_per_token", "lm_head_flops", "weight_read_bytes",
                 "attn_flops_per_pair", "kv_bytes_per_token")

    def __init__(self, model: ModelProfile, dtype: str, kv_cache_dtype: str = "auto",
                 weight_dtype: str = "auto") -> None:
        self.model = model
        self.bytes_per_el = dtype_bytes(dtype)
        self.layer_flops_per_token = 2.0 * model.num_layers * model.layer_params
        self.lm_head_flops = 2.0 * model.lm_head_params
        self.weight_read_bytes = float((model.num_layers * model.layer_params + model.lm_head_params)
                                       * weight_bytes_per_param(weight_dtype, dtype))
        self.attn_flops_per_pair = 4.0 * model.num_layers * model.num_heads * model.head_dim
        self.kv_bytes_per_token = float(model.kv_bytes_per_token(dtype, 1, kv_cache_dtype))

    def linear(self, f: BatchFeatures) -> tuple[float, float]:
        flops = self.layer_flops_per_token * f.num_tokens + self.lm_head_flops * f.num_sampled
        return flops, (self.weight_read_bytes if f.num_tokens else 0.0)

    def attention(self, f: BatchFeatures) -> tuple[float, float]:
        flops = self.attn_flops_per_pair * (f.chunk_attn_pairs + f.single_kv_tokens)
        kv = self.kv_bytes_per_token * (f.single_kv_tokens + f.chunk_kv_tokens + f.num_tokens)
        return flops, kv


class RooflineCostModel:
    """Datasheet roofline per operator group, divided over `tp` devices, plus all-reduces."""

    def __init__(self, hw: HardwareProfile, model: ModelProfile, dtype: str, tp: int = 1,
                 block_size: int = 16, kv_cache_dtype: str = "auto", weight_dtype: str = "auto") -> None:
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp must be an integer >= 1, got {tp!r}")
        weights = "" if weight_dtype == "auto" else f"+w{weight_dtype}"
        self.name = f"roofline:{hw.name}x{tp}:{model.name}:{dtype}{weights}"
        self.hw, self.model, self.dtype, self.tp = hw, model, dtype, tp
        self.counts = StepCounts(model, dtype, kv_cache_dtype, weight_dtype)
        self.peak_flops = hw.flops(dtype) * tp
        self.peak_bw = hw.mem_bandwidth * tp
        self.eff_flops = self.peak_flops * hw.compute_efficiency
        self.eff_bw = self.peak_bw * hw.bandwidth_efficiency
        self.swap_block_s = model.kv_bytes_per_token(dtype, tp, kv_cache_dtype) * block_size / hw.host_link_bandwidth
        self.copy_token_s = segment_copy_token_s(hw, model.kv_bytes_per_token(dtype, tp, kv_cache_dtype))

    def comm_time(self, num_tokens: int) -> float:
        if self.tp == 1 or num_tokens == 0:
            return 0.0
        if self.hw.link_bandwidth <= 0:
            raise ValueError(f"hardware {self.hw.name!r} has no interconnect bandwidth for tp={self.tp}")
        msg = num_tokens * self.model.hidden_size * self.counts.bytes_per_el
        ring = 2.0 * (self.tp - 1) / self.tp * msg / self.hw.link_bandwidth
        return 2 * self.model.num_layers * (ring + self.hw.allreduce_latency_s)

    def step_cost(self, f: BatchFeatures) -> StepCost:
        lin_flops, lin_bytes = self.counts.linear(f)
        att_flops, att_bytes = self.counts.attention(f)
        linear_s = max(lin_flops / self.eff_flops, lin_bytes / self.eff_bw)
        attention_s = max(att_flops / self.eff_flops, att_bytes / self.eff_bw)
        comm_s = (self.comm_time(f.num_tokens) + self.swap_block_s * f.num_swap_blocks
                  + self.copy_token_s * f.num_segment_copy_tokens)
        overhead_s = self.hw.step_overhead_s + self.hw.seq_overhead_s * f.num_seqs if f.num_seqs else 0.0
        return _cost(linear_s, attention_s, comm_s, overhead_s, lin_flops + att_flops, lin_bytes + att_bytes,
                     self.peak_flops, self.peak_bw)


def segment_copy_token_s(hw: HardwareProfile, kv_bytes_per_token: int) -> float:
    """Seconds per token of a device-side KV copy (segment reuse): its K and V read and written
    once at the achievable memory bandwidth (the RoPE re-rotation's few FLOPs per element hide
    under the traffic)."""
    return 2 * kv_bytes_per_token / (hw.mem_bandwidth * hw.bandwidth_efficiency)


def _cost(linear_s: float, attention_s: float, comm_s: float, overhead_s: float, flops: float,
          nbytes: float, peak_flops: float, peak_bw: float) -> StepCost:
    t = linear_s + attention_s + comm_s + overhead_s
    cu = flops / (t * peak_flops) if t > 0 else 0.0
    bu = nbytes / (t * peak_bw) if t > 0 else 0.0
    return StepCost(t, linear_s, attention_s, comm_s, overhead_s, flops, nbytes, cu, bu)


# Features of the fitted model, in order; all non-negative, coefficients fitted non-negative.
LINEAR_FEATURES = (
    "const",                # per step: Python scheduling, tensor building, launches
    "linear_roofline_s",    # max(weights / bandwidth, linear FLOPs / compute) at measured peaks
    "tokens",               # per-token work beyond the GEMMs (norms, rope, KV writes)
    "sampled",              # LM-head rows and sampling
    "seqs",                 # per-request bookkeeping (engine update, block tables)
    "chunks",               # one attention call (per layer) per prefill chunk
    "chunk_attn_pairs",     # causal attention compute of prefill chunks
    "chunk_kv_tokens",      # context gathered back from the paged cache for later chunks
    "single_kv_tokens",     # decode attention: keys read (a block-table kernel reads each row's own)
    "single_padded_kv",     # decode attention: rows x longest context (the torch reference backend pads)
    "gemm_step",            # 1 when the step has >= 2 tokens: matrix-matrix kernels instead of
                            # matrix-vector ones, a different (CPU: slower per step) regime
    "tiny_gemm_step",       # 1 for 2-3 tokens, the least efficient GEMM shapes
)
# added after the first calibrations: a calibration without them reads them as 0
_OPTIONAL_FEATURES = ("gemm_step", "tiny_gemm_step")


def feature_vector(f: BatchFeatures, counts: StepCounts, peak_flops: float, peak_bw: float) -> list[float]:
    lin_flops, lin_bytes = counts.linear(f)
    roof = max(lin_flops / peak_flops, lin_bytes / peak_bw)
    return [1.0 if f.num_seqs else 0.0, roof, float(f.num_tokens), float(f.num_sampled), float(f.num_seqs),
            float(f.num_chunks), float(f.chunk_attn_pairs), float(f.chunk_kv_tokens), float(f.single_kv_tokens),
            float(f.num_single * f.single_max_ctx), 1.0 if f.num_tokens >= 2 else 0.0,
            1.0 if 2 <= f.num_tokens <= 3 else 0.0]


class LinearCostModel:
    """Step time = sum(coefficient x feature), fitted on this machine by `pacer sim calibrate`."""

    def __init__(self, hw: HardwareProfile, model: ModelProfile, dtype: str, coefficients: dict[str, float],
                 block_size: int = 16, kv_cache_dtype: str = "auto") -> None:
        missing = [k for k in LINEAR_FEATURES if k not in coefficients and k not in _OPTIONAL_FEATURES]
        if missing:
            raise ValueError(f"calibration lacks coefficients for {missing}")
        self.name = f"calibrated:{hw.name}:{model.name}:{dtype}"
        self.counts = StepCounts(model, dtype, kv_cache_dtype)
        self.peak_flops = hw.flops(dtype)
        self.peak_bw = hw.mem_bandwidth
        self.coef = [float(coefficients.get(k, 0.0)) for k in LINEAR_FEATURES]
        self.swap_block_s = model.kv_bytes_per_token(dtype, 1, kv_cache_dtype) * block_size / hw.host_link_bandwidth
        self.copy_token_s = segment_copy_token_s(hw, model.kv_bytes_per_token(dtype, 1, kv_cache_dtype))

    def step_cost(self, f: BatchFeatures) -> StepCost:
        x = feature_vector(f, self.counts, self.peak_flops, self.peak_bw)
        c = self.coef
        parts = [ci * xi for ci, xi in zip(c, x)]
        linear_s = parts[1] + parts[2] + parts[3]
        attention_s = parts[5] + parts[6] + parts[7] + parts[8] + parts[9]
        overhead_s = parts[0] + parts[4] + parts[10] + parts[11]
        lin_flops, lin_bytes = self.counts.linear(f)
        att_flops, att_bytes = self.counts.attention(f)
        copies_s = self.swap_block_s * f.num_swap_blocks + self.copy_token_s * f.num_segment_copy_tokens
        return _cost(linear_s, attention_s, copies_s, overhead_s, lin_flops + att_flops, lin_bytes + att_bytes,
                     self.peak_flops, self.peak_bw)


def make_cost_model(hw: HardwareProfile, model: ModelProfile, dtype: str, tp: int = 1,
                    block_size: int = 16, kv_cache_dtype: str = "auto", weight_dtype: str = "auto") -> CostModel:
    """The calibrated model when this hardware has a fit for this model and dtype (float weights),
    else the roofline; either prices KV reads and swaps at `kv_cache_dtype`'s bytes, the roofline
    reads the projection weights at `weight_dtype`'s bytes (auto: the model's dtype)."""
    calib = hw.calibration
    if calib and tp == 1 and weight_dtype == "auto" and calib.get("model") == model.name \
            and calib.get("dtype") == dtype:
        return LinearCostModel(hw, model, dtype, dict(calib["coefficients"]), block_size, kv_cache_dtype)
    return RooflineCostModel(hw, model, dtype, tp, block_size, kv_cache_dtype, weight_dtype)
