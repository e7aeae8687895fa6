"""The cost model reads projection weights at the weight dtype's bytes (packed quantized blocks)."""

from __future__ import annotations

import pytest

from pacer.perf.cost_model import BatchFeatures, StepCounts, make_cost_model
from pacer.perf.profiles import MODELS, get_hardware, weight_bytes_per_param, weight_dtype_for


def test_quantized_weights_cut_decode_bytes() -> None:
    model = next(iter(MODELS.values()))
    f32 = StepCounts(model, "float32")
    q4 = StepCounts(model, "float32", weight_dtype="q4_1")
    assert q4.weight_read_bytes == pytest.approx(f32.weight_read_bytes * 0.75 / 4)
    hw = get_hardware("h100-sxm")
    decode = BatchFeatures(num_tokens=1, num_seqs=1, num_single=1, single_kv_tokens=128, single_max_ctx=128,
                           num_sampled=1, num_decode_tokens=1)
    slow = make_cost_model(hw, model, "bfloat16").step_cost(decode)
    fast = make_cost_model(hw, model, "bfloat16", weight_dtype="int8").step_cost(decode)
    assert fast.linear_s < slow.linear_s and fast.bytes < slow.bytes


def test_weight_dtype_names() -> None:
    assert weight_dtype_for("gguf") == "q4_1" and weight_dtype_for("none") == "auto"
    assert weight_bytes_per_param("auto", "bfloat16") == 2
    with pytest.raises(ValueError, match="weight_dtype"):
        weight_bytes_per_param("q3_k", "float32")
