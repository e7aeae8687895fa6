"""Cost-model arithmetic on hand-computed cases; profiles and KV sizing."""

from __future__ import annotations

import pytest

from pacer.perf.cost_model import (
    BatchFeatures,
    LinearCostModel,
    RooflineCostModel,
    batch_features,
    make_cost_model,
)
from pacer.perf.profiles import HardwareProfile, ModelProfile, get_hardware, get_model, kv_capacity_blocks
from pacer.sched.contract import ScheduledRequest, SchedulerOutput

# layer params: qkv 4*(2+2)*2=32, o 2*2*4=16, mlp 3*4*8=96 -> 144; lm head 10*4=40
TINY = ModelProfile("tiny", num_layers=2, hidden_size=4, intermediate_size=8, num_heads=2, num_kv_heads=1,
                    head_dim=2, vocab_size=10, max_model_len=64)
HW = HardwareProfile("round", memory_bytes=10_000, peak_flops={"bfloat16": 1000.0}, mem_bandwidth=100.0,
                     compute_efficiency=0.5, bandwidth_efficiency=0.5, link_bandwidth=10.0,
                     allreduce_latency_s=0.25, step_overhead_s=1.0, seq_overhead_s=0.5, reserve_bytes=0)


def sr(rid: str, n: int, start: int, sample: bool = True) -> ScheduledRequest:
    return ScheduledRequest(rid, list(range(n)), start, [], False, sample, n > 1, 0)


def out(*rows: ScheduledRequest) -> SchedulerOutput:
    pre = sum(r.num_tokens for r in rows if r.is_prefill)
    dec = sum(r.num_tokens for r in rows if not r.is_prefill)
    return SchedulerOutput(0, list(rows), pre, dec)


def test_model_parameter_counts():
    assert TINY.layer_params == 144
    assert TINY.num_params == 2 * 144 + 40 + 40
    assert TINY.kv_bytes_per_token("bfloat16") == 2 * 2 * 1 * 2 * 2
    assert abs(get_model("smollm2-135m").num_params - 134.5e6) < 0.5e6
    assert abs(get_model("llama-3.1-8b").num_params - 8.03e9) < 0.02e9
    assert abs(get_model("llama-3.1-70b").num_params - 70.55e9) < 0.1e9
    # KV heads split by tp, replicated once tp exceeds them
    m = get_model("llama-3.1-70b")
    assert m.kv_bytes_per_token("bfloat16", tp=8) == m.kv_bytes_per_token("bfloat16") // 8
    assert m.kv_bytes_per_token("bfloat16", tp=16) == m.kv_bytes_per_token("bfloat16") // 8


def test_batch_features_count_chunks_decodes_and_attention_pairs():
    f = batch_features(out(sr("a", 1, 9), sr("b", 1, 4), sr("c", 3, 0), sr("d", 2, 5, sample=False)))
    assert f.num_tokens == 7 and f.num_seqs == 4
    assert (f.num_single, f.single_kv_tokens, f.single_max_ctx) == (2, 10 + 5, 10)
    assert f.num_chunks == 2
    assert f.chunk_attn_pairs == (3 * 0 + 6) + (2 * 5 + 3)   # causal pairs: n*start + n(n+1)/2
    assert f.chunk_kv_tokens == 3 + 7
    assert f.num_sampled == 3


def test_roofline_decode_step_by_hand():
    # one decode at context 4: linear flops 2*2*144*1 + 2*40*1 = 656; weights read (2*144+40)*2 = 656 B
    cm = RooflineCostModel(HW, TINY, "bfloat16")
    c = cm.step_cost(BatchFeatures(num_tokens=1, num_seqs=1, num_single=1, single_kv_tokens=4, single_max_ctx=4,
                                   num_sampled=1, num_decode_tokens=1))
    assert c.linear_s == pytest.approx(max(656 / 500, 656 / 50))           # memory-bound: 13.12 s
    # attention: flops 4*L*H*d*pairs = 4*2*2*2*4 = 128; KV bytes 16 B/token * (4 read + 1 written) = 80
    assert c.attention_s == pytest.approx(max(128 / 500, 80 / 50))
    assert c.overhead_s == pytest.approx(1.0 + 0.5)
    assert c.comm_s == 0.0
    assert c.time_s == pytest.approx(656 / 50 + 80 / 50 + 1.5)
    assert c.bound == "memory"
    assert c.bandwidth_util == pytest.approx((656 + 80) / (c.time_s * 100))


def test_roofline_prefill_is_compute_bound_and_tp_adds_allreduce():
    f = BatchFeatures(num_tokens=100, num_seqs=1, num_chunks=1, chunk_attn_pairs=5050, chunk_kv_tokens=100,
                      num_sampled=1, num_prefill_tokens=100)
    c1 = RooflineCostModel(HW, TINY, "bfloat16").step_cost(f)
    lin_flops = 2 * 2 * 144 * 100 + 2 * 40
    assert c1.linear_s == pytest.approx(lin_flops / 500)
    assert c1.bound == "compute"
    c2 = RooflineCostModel(HW, TINY, "bfloat16", tp=2).step_cost(f)
    assert c2.linear_s == pytest.approx(lin_flops / 1000)
    # 2 all-reduces per layer of 100 tokens x 4 hidden x 2 B: ring 2*(1/2)*800/10 = 80 s, + latency
    assert c2.comm_s == pytest.approx(2 * 2 * (80 + 0.25))


def test_linear_model_is_a_dot_product():
    coef = {"const": 1.0, "linear_roofline_s": 0.0, "tokens": 2.0, "sampled": 0.0, "seqs": 0.5, "chunks": 0.0,
            "chunk_attn_pairs": 0.0, "chunk_kv_tokens": 0.0, "single_kv_tokens": 0.25, "single_padded_kv": 0.0}
    cm = LinearCostModel(HW, TINY, "bfloat16", coef)
    c = cm.step_cost(BatchFeatures(num_tokens=3, num_seqs=3, num_single=3, single_kv_tokens=12, single_max_ctx=6))
    assert c.time_s == pytest.approx(1.0 + 2 * 3 + 0.5 * 3 + 0.25 * 12)
    with pytest.raises(ValueError, match="lacks"):
        LinearCostModel(HW, TINY, "bfloat16", {"const": 1.0})


def test_make_cost_model_uses_calibration_only_for_its_model():
    cpu = get_hardware("cpu-local")
    assert isinstance(make_cost_model(cpu, get_model("smollm2-135m"), "float32"), LinearCostModel)
    assert isinstance(make_cost_model(cpu, get_model("llama-3.1-8b"), "float32"), RooflineCostModel)
    assert isinstance(make_cost_model(get_hardware("h100-sxm"), get_model("llama-3.1-8b"), "bfloat16", 2),
                      RooflineCostModel)


def test_kv_capacity_as_a_real_engine_sizes_it():
    hw = HardwareProfile("m", memory_bytes=10_000, peak_flops={"bfloat16": 1.0}, mem_bandwidth=1.0, reserve_bytes=1000)
    # 10000*0.9 - weights (368*2=736) - 1000 reserve = 7264 B; block = 16 B/token * 4 tokens = 64 B -> 113
    assert kv_capacity_blocks(hw, TINY, "bfloat16", 1, 4, 0.9) == 113
    with pytest.raises(ValueError, match="does not fit"):
        kv_capacity_blocks(get_hardware("a100-80g"), get_model("llama-3.1-70b"), "bfloat16", 1, 16, 0.9)
    a100 = get_hardware("a100-80g")
    blocks = kv_capacity_blocks(a100, get_model("llama-3-8b"), "bfloat16", 1, 16, 0.9)
    assert 20_000 < blocks < 30_000   # ~54 GB of KV at 128 KiB per token


def test_seed_physics_decode_memory_bound_prefill_compute_bound():
    cm = RooflineCostModel(get_hardware("a100-80g"), get_model("llama-3-8b"), "bfloat16")
    dec = cm.step_cost(BatchFeatures(num_tokens=64, num_seqs=64, num_single=64, single_kv_tokens=64 * 600,
                                     single_max_ctx=600, num_sampled=64, num_decode_tokens=64))
    pre = cm.step_cost(BatchFeatures(num_tokens=512, num_seqs=1, num_chunks=1, chunk_attn_pairs=512 * 513 // 2,
                                     chunk_kv_tokens=512, num_sampled=1, num_prefill_tokens=512))
    assert dec.bound == "memory" and dec.bandwidth_util > 0.6
    assert pre.bound == "compute" and pre.compute_util > 0.6
    one = cm.step_cost(BatchFeatures(num_tokens=1, num_seqs=1, num_single=1, single_kv_tokens=600, single_max_ctx=600,
                                     num_sampled=1, num_decode_tokens=1))
    assert 0.008 < one.time_s < 0.011   # 16 GB of weights over 2 TB/s


def test_any_hf_config_json_is_a_model_profile(tmp_path):
    cfg = {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 24,
           "intermediate_size": 5632, "vocab_size": 32000, "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(__import__("json").dumps(cfg))
    m = get_model(str(tmp_path))
    assert (m.num_layers, m.head_dim, m.num_kv_heads, m.max_model_len) == (24, 128, 4, 4096)
    assert get_model(str(tmp_path / "config.json")) == m
    with pytest.raises(ValueError, match="model must be one of"):
        get_model("no-such-model")


def test_swapped_blocks_cost_host_link_time():
    hw = HardwareProfile("h", memory_bytes=10_000, peak_flops={"bfloat16": 1000.0}, mem_bandwidth=100.0,
                         host_link_bandwidth=32.0, step_overhead_s=0.0, seq_overhead_s=0.0)
    cm = RooflineCostModel(hw, TINY, "bfloat16", block_size=4)
    base = BatchFeatures(num_tokens=1, num_seqs=1, num_single=1, single_kv_tokens=4, single_max_ctx=4, num_sampled=1)
    import dataclasses

    with_swap = dataclasses.replace(base, num_swap_blocks=3)
    # a block is 16 B/token x 4 tokens = 64 B; 3 blocks over 32 B/s = 6 s
    assert cm.step_cost(with_swap).time_s - cm.step_cost(base).time_s == pytest.approx(6.0)
    out = SchedulerOutput(0, [sr("a", 1, 3)], 0, 1, swap_out=[(1, 0), (2, 1)], swap_in=[(0, 5)])
    assert batch_features(out).num_swap_blocks == 3


def test_quantized_kv_is_priced_smaller_in_capacity_kv_reads_and_swaps():
    m, hw = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
    bf16 = m.kv_bytes_per_token("bfloat16")
    assert m.kv_bytes_per_token("bfloat16", kv_cache_dtype="int8") == 2 * 32 * 8 * (128 + 2)
    assert m.kv_bytes_per_token("bfloat16", kv_cache_dtype="fp8") == bf16 // 2
    auto = kv_capacity_blocks(hw, m, "bfloat16", 1, 16, 0.9)
    assert kv_capacity_blocks(hw, m, "bfloat16", 1, 16, 0.9, kv_cache_dtype="int8") >= 1.9 * auto
    f = BatchFeatures(num_tokens=32, num_seqs=32, num_single=32, single_kv_tokens=32 * 4096, single_max_ctx=4096,
                      num_sampled=32, num_decode_tokens=32, num_swap_blocks=10)
    full, q8 = RooflineCostModel(hw, m, "bfloat16"), RooflineCostModel(hw, m, "bfloat16", kv_cache_dtype="fp8")
    assert q8.counts.attention(f)[1] == full.counts.attention(f)[1] / 2
    assert q8.step_cost(f).time_s < full.step_cost(f).time_s and q8.swap_block_s == full.swap_block_s / 2
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        m.kv_bytes_per_token("bfloat16", kv_cache_dtype="int4")


def test_segment_copies_cost_device_memory_time():
    """Segment reuse: every token a step stores or fills reads and writes its K and V once."""
    import dataclasses

    from pacer.kv.segment_store import SegmentCopy

    hw = HardwareProfile("h", memory_bytes=10_000, peak_flops={"bfloat16": 1000.0}, mem_bandwidth=64.0,
                         bandwidth_efficiency=0.5, step_overhead_s=0.0, seq_overhead_s=0.0)
    base = BatchFeatures(num_tokens=1, num_seqs=1, num_single=1, single_kv_tokens=4, single_max_ctx=4, num_sampled=1)
    with_copies = dataclasses.replace(base, num_segment_copy_tokens=5)
    # 16 B/token read and written = 32 B per token over 32 B/s effective: 1 s per token
    for cm in (RooflineCostModel(hw, TINY, "bfloat16", block_size=4),
               LinearCostModel(hw, TINY, "bfloat16", {k: 0.0 for k in _linear_keys()}, block_size=4)):
        assert cm.step_cost(with_copies).time_s - cm.step_cost(base).time_s == pytest.approx(5.0)
    step = SchedulerOutput(0, [sr("a", 3, 10)], 3, 0, segment_saves=[SegmentCopy((1, 2), (8, 9))],
                           segment_fills=[SegmentCopy((8, 9, 10), (20, 21, 22), 5)])
    assert batch_features(step).num_segment_copy_tokens == 5
    assert batch_features(out(sr("a", 3, 10))).num_segment_copy_tokens == 0


def _linear_keys() -> list[str]:
    from pacer.perf.cost_model import LINEAR_FEATURES

    return list(LINEAR_FEATURES)
